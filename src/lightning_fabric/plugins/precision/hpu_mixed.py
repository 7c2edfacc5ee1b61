"""Mixed precision on Intel Gaudi: ``torch.autocast("hpu")`` in bf16 or fp16, with Gaudi's op lists."""

import os
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Optional, Union

import torch
from lightning.fabric.plugins.precision.amp import MixedPrecision
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch.nn import Module
from typing_extensions import override

from lightning_fabric.plugins.precision.hpu import HPUPrecision, check_generation, unified_precision

AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16, "fp8": torch.bfloat16}
# the keys of the ``hmp_params`` dict of earlier Lightning releases, and the arguments they stand for
_HMP_PARAMS = {"level": "opt_level", "verbose": "verbose", "bf16_ops": "bf16_file_path", "fp32_ops": "fp32_file_path"}
# Gaudi's autocast reads its lower-precision and fp32 op lists from the files these variables name, once, when the
# bridge loads (Intel's bridge 1.19 and newer); the second names are those older Gaudi software read (up to the 2023
# releases, which read the first names and fell back to these with a deprecation warning)
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
    Gaudi's bridge reads the op lists once, when it loads, from the files that
    ``PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST`` and ``PT_HPU_AUTOCAST_FP32_OPS_LIST`` name. Lists given here are
    handed to it through those variables (and ``LOWER_LIST``/``FP32_LIST``, which older Gaudi software reads) when the
    plugin is built, if the bridge has not loaded yet; they stay set for the rest of the process and the processes it
    starts. Once the bridge has loaded (``import torch`` loads it in eager mode), lists other than those it read are
    refused here, with how to set them before Python starts.

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
        # the device's generation is asked for last: asking loads the bridge, which must see the op lists first
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
        # checked now, so that a typo fails before any work
        self.op_list_files = _hand_op_lists_to_bridge(settings, type(self).__name__)
        check_generation(self.precision)

    def autocast_context_manager(self) -> AbstractContextManager:
        """``torch.autocast("hpu")`` in this precision's lower type."""
        return torch.autocast(device_type="hpu", dtype=AUTOCAST_DTYPES[self.precision])

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


def _bridge_loaded() -> bool:
    """Whether Gaudi's bridge (or the virtual Gaudi's facade) has loaded in this process, and so read its op lists."""
    return "habana_frameworks.torch" in sys.modules


def _hand_op_lists_to_bridge(settings: dict[str, Any], owner: str) -> dict[str, Optional[str]]:
    """The op-list files in force, by the variable the bridge reads: those given, else those the environment names.

    Files given that the environment does not already name are put in it for the bridge to read when it loads; once it
    has loaded, that is too late, and they are refused."""
    in_force: dict[str, Optional[str]] = {}
    to_hand: dict[tuple[str, str], str] = {}
    for argument, (variable, older) in _OP_LIST_VARIABLES.items():
        current = os.environ.get(variable) or None
        if settings[argument] is None:
            if current is None and os.environ.get(older):
                rank_zero_warn(
                    f"{older} is set but Gaudi software 1.19 and newer reads {variable} instead: set it to the same"
                    " file before Python starts, or the default list applies there."
                )
            in_force[variable] = _validated_op_list(current, argument, variable)
            continue
        path = _checked_op_list(settings[argument], argument, variable)
        in_force[variable] = path
        if current is None or Path(current).resolve() != Path(path):
            to_hand[(variable, older)] = path
    if to_hand and _bridge_loaded():
        read = ", ".join(
            f"{variable}={os.environ[variable]!r}" if os.environ.get(variable) else f"{variable} unset"
            for variable, _ in to_hand
        )
        assignments = " ".join(f"{variable}={path}" for variable, path in in_force.items() if path is not None)
        raise MisconfigurationException(
            f"`{owner}` was given op lists that Gaudi's bridge has not read: it reads them once, when it loads, and it"
            f" has loaded already (`import torch` loads it in eager mode), with {read}. Set the variables before"
            f" Python starts, e.g. `{assignments} python train.py`; the plugin's arguments may then name the same"
            " files or be left out."
        )
    for (variable, older), path in to_hand.items():
        os.environ[variable] = os.environ[older] = path
    return in_force


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


def _validated_op_list(path: Optional[str], argument: str, variable: str) -> Optional[str]:
    return None if path is None else _checked_op_list(path, argument, variable)


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
