"""Mixed precision on Intel Gaudi: ``torch.autocast("hpu")`` in bf16 or fp16, with Gaudi's op lists."""

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Optional, Union

import torch
from lightning.fabric.plugins.precision.amp import MixedPrecision
from lightning.fabric.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch.nn import Module
from typing_extensions import override

from lightning_fabric.plugins.precision.hpu import HPUPrecision, check_generation, unified_precision
from lightning_fabric.plugins.precision.hpu_op_lists import HPUAutocastOpLists

AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16, "fp8": torch.bfloat16}
# the keys of the ``hmp_params`` dict of earlier Lightning releases, and the arguments they stand for
_HMP_PARAMS = {"level": "opt_level", "verbose": "verbose", "bf16_ops": "bf16_file_path", "fp32_ops": "fp32_file_path"}
# the variable Gaudi's bridge (1.19 and newer) reads each list from, and the one older Gaudi software read
_OP_LIST_VARIABLES = {
    "bf16_file_path": ("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", "LOWER_LIST"),
    "fp32_file_path": ("PT_HPU_AUTOCAST_FP32_OPS_LIST", "FP32_LIST"),
}


class HPUMixedPrecision(HPUPrecision, MixedPrecision, builds=("bf16-mixed", "16-mixed")):
    """Upstream's Fabric ``MixedPrecision`` on HPUs: ``torch.autocast("hpu")`` in bf16 (``"bf16-mixed"``) or fp16
    (``"16-mixed"``, Gaudi2 and newer), with Gaudi's op lists deciding which ops run in lower precision and which stay
    in fp32, and without loss scaling; inputs enter the model in the autocast type and outputs leave it in the default
    type, as with upstream's. The Trainer's :class:`pytorch_lightning.plugins.HPUMixedPrecision` derives from it.

    ``Fabric(accelerator="hpu", precision="bf16-mixed")`` builds it; pass it in ``plugins`` to give op lists.
    Gaudi's bridge reads its op lists once, when it loads, from the files that
    ``PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST`` and ``PT_HPU_AUTOCAST_FP32_OPS_LIST`` name; a list given here
    replaces the bridge's for the length of the plugin's autocast, in eager mode (compiled or not) and in lazy mode
    (:class:`~lightning_fabric.plugins.precision.hpu_op_lists.HPUAutocastOpLists`), so two runs in one process may
    give different lists. A list left out is the bridge's.

    Args:
        precision: ``"bf16-mixed"`` or ``"16-mixed"``; ``16`` and ``"16"`` mean ``"bf16-mixed"``, as in Lightning 1.x.
        opt_level: ``"O1"``: ops in the lower-precision list run in bf16/fp16, ops in the fp32 list in fp32, all
            others in the type of their inputs.
        bf16_file_path: a text file with one op name per line to run in lower precision.
        fp32_file_path: a text file with one op name per line to keep in fp32.
        verbose: log the op lists in effect when a run starts.
        hmp_params: the same settings as a dict with keys ``level``, ``verbose``, ``bf16_ops`` and ``fp32_ops``
            (Lightning 1.x).
    """

    _precisions: tuple[str, ...] = ("bf16-mixed", "16-mixed")
    # Gaudi trains without a gradient scaler, in fp16 too; upstream's steps and state then pass through
    scaler = None

    def __init__(
        self,
        precision: Union[str, int] = "bf16-mixed",
        opt_level: str = "O1",
        bf16_file_path: Optional[str] = None,
        fp32_file_path: Optional[str] = None,
        verbose: bool = False,
        hmp_params: Optional[dict[str, Any]] = None,
    ) -> None:
        # the device's generation is asked for last, after the checks of the arguments alone
        self.precision = unified_precision(precision, self._precisions, type(self).__name__)
        settings = {
            "opt_level": opt_level,
            "verbose": verbose,
            "bf16_file_path": bf16_file_path,
            "fp32_file_path": fp32_file_path,
        }
        settings.update(_settings_from_hmp_params(hmp_params, explicit=settings))
        if settings["opt_level"] != "O1":
            raise ValueError(
                f"`{type(self).__name__}(opt_level={settings['opt_level']!r})` is not supported: Gaudi's autocast"
                " implements 'O1' (op lists). Use `opt_level='O1'` and list the ops to lower in `bf16_file_path`."
            )
        self.verbose = bool(settings["verbose"])
        # read now, so that a typo fails before any work
        self.op_list_files = _op_list_files(settings)
        self.op_lists = HPUAutocastOpLists(
            *(_read_op_list(settings[argument]) for argument in ("bf16_file_path", "fp32_file_path"))
        )
        check_generation(self.precision)

    @contextmanager
    def autocast_context_manager(self) -> Iterator[None]:
        """``torch.autocast("hpu")`` in this precision's lower type, with the op lists given in force."""
        with self.op_lists.in_force(), torch.autocast(device_type="hpu", dtype=AUTOCAST_DTYPES[self.precision]):
            yield

    @override
    def forward_context(self) -> AbstractContextManager:
        return self.autocast_context_manager()

    @property
    def _desired_input_dtype(self) -> torch.dtype:
        # what upstream's Fabric `MixedPrecision` casts inputs to (and its compute-dtype lookup reads), set there by a
        # constructor this plugin does not run
        return AUTOCAST_DTYPES[self.precision]

    @override
    def convert_module(self, module: Module) -> Module:
        if self.verbose:
            rank_zero_info(f"HPU autocast to {AUTOCAST_DTYPES[self.precision]} with op lists {self.op_list_files}")
        return super().convert_module(module)


def _op_list_files(settings: dict[str, Any]) -> dict[str, Optional[str]]:
    """The op-list file in force for each variable the bridge reads: the one given, else the one the environment
    names (checked: the bridge read it when it loaded)."""
    in_force: dict[str, Optional[str]] = {}
    for argument, (variable, older) in _OP_LIST_VARIABLES.items():
        if settings[argument] is not None:
            in_force[variable] = _checked_op_list(settings[argument], argument, variable)
            continue
        current = os.environ.get(variable) or None
        if current is None and os.environ.get(older):
            rank_zero_warn(
                f"{older} is set but Gaudi software 1.19 and newer reads {variable} instead: set it to the same"
                " file before Python starts, or pass the file to the plugin, or the default list applies there."
            )
        in_force[variable] = None if current is None else _checked_op_list(current, argument, variable)
    return in_force


def _read_op_list(path: Optional[str]) -> Optional[list[str]]:
    return None if path is None else Path(path).read_text().splitlines()


def _settings_from_hmp_params(hmp_params: Optional[dict[str, Any]], explicit: dict[str, Any]) -> dict[str, Any]:
    if not hmp_params:
        return {}
    unknown = set(hmp_params) - set(_HMP_PARAMS)
    if unknown:
        raise ValueError(
            f"`hmp_params` has unknown keys {sorted(unknown)}. The keys are {', '.join(map(repr, _HMP_PARAMS))}."
        )
    defaults = {"opt_level": "O1", "verbose": False, "bf16_file_path": None, "fp32_file_path": None}
    clashes = [
        key for key, argument in _HMP_PARAMS.items() if key in hmp_params and explicit[argument] != defaults[argument]
    ]
    if clashes:
        raise ValueError(f"`hmp_params` keys {clashes} repeat constructor arguments of `HPUPrecisionPlugin`; pass one.")
    return {_HMP_PARAMS[key]: value for key, value in hmp_params.items()}


def _checked_op_list(path: str, argument: str, variable: str) -> str:
    """Check that an op-list file exists and names only real ops, so a typo fails now rather than mid-training; return
    its absolute path."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(
            f"The op list for `{argument}` (Gaudi's {variable}) does not exist: {str(file)!r}. Pass the path of a"
            " text file with one op name per line."
        )
    # Gaudi's own names for ops (aten names, and those of its published lists and of HMP files); importing it
    # activates nothing
    from virtual_hpu.op_names import resolve

    resolve(file.read_text().splitlines(), f"The op list {str(file)!r} (`{argument}`)")
    return str(file.resolve())
