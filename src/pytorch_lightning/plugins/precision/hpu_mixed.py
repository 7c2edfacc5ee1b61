"""Mixed precision on Intel Gaudi: ``torch.autocast("hpu")`` in bf16 or fp16, with Gaudi's op lists."""

import os
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Optional, Union

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch.nn import Module
from typing_extensions import override

from pytorch_lightning.plugins.precision.hpu import HPUPrecisionPlugin, validate_precision

AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16, "fp8": torch.bfloat16}
# the keys of the ``hmp_params`` dict of earlier Lightning releases, and the arguments they stand for
_HMP_PARAMS = {"level": "opt_level", "verbose": "verbose", "bf16_ops": "bf16_file_path", "fp32_ops": "fp32_file_path"}
# Gaudi's autocast reads its lower-precision and fp32 op lists from the files these variables name
_OP_LIST_VARIABLES = {"bf16_file_path": "LOWER_LIST", "fp32_file_path": "FP32_LIST"}
# what installing the op lists sets in the process environment (the bridge records the mode too)
_INSTALLED_VARIABLES = ("LOWER_LIST", "FP32_LIST", "PT_HPU_LAZY_MODE")


class HPUMixedPrecision(HPUPrecisionPlugin):
    """Mixed precision on HPUs: ``torch.autocast("hpu")`` in bf16 (``"bf16-mixed"``) or fp16 (``"16-mixed"``, Gaudi2
    and newer), with Gaudi's op lists deciding which ops run in lower precision and which stay in fp32.

    ``Trainer(accelerator="hpu", precision="bf16-mixed")`` builds it; pass it in ``plugins`` to give op lists. The
    lists are installed when a run starts (``LOWER_LIST``/``FP32_LIST``, as Gaudi's autocast reads them) and the
    process is put back as it was when the run ends, also when it fails: building the plugin changes nothing.

    Args:
        precision: ``"bf16-mixed"`` or ``"16-mixed"``; ``16`` and ``"16"`` mean ``"bf16-mixed"``, as in Lightning 1.x.
        opt_level: ``"O1"``: ops in the lower-precision list run in bf16/fp16, ops in the fp32 list in fp32, all
            others in the type of their inputs.
        bf16_file_path: a text file with one op name per line to run in lower precision (Gaudi's ``LOWER_LIST``).
        fp32_file_path: a text file with one op name per line to keep in fp32 (Gaudi's ``FP32_LIST``).
        verbose: log the op lists in effect when a run starts.
        hmp_params: the same settings as a dict with keys ``level``, ``verbose``, ``bf16_ops`` and ``fp32_ops``
            (Lightning 1.x).
    """

    _precisions: tuple[str, ...] = ("bf16-mixed", "16-mixed")
    # the environment as it was before this run installed the op lists; ``None`` while none are installed
    _environment_before: Optional[dict[str, Optional[str]]] = None

    def __init__(
        self,
        precision: Union[str, int] = "bf16-mixed",
        opt_level: str = "O1",
        bf16_file_path: Optional[str] = None,
        fp32_file_path: Optional[str] = None,
        verbose: bool = False,
        hmp_params: Optional[dict[str, Any]] = None,
    ) -> None:
        self.precision = validate_precision(precision, self._precisions, type(self).__name__)
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
        # checked now, so that a typo fails before any work; the environment's lists count as given
        self.op_list_files = {
            variable: _validated_op_list(settings[argument] or os.environ.get(variable), argument, variable)
            for argument, variable in _OP_LIST_VARIABLES.items()
        }

    def autocast_context_manager(self) -> AbstractContextManager:
        """``torch.autocast("hpu")`` in this precision's lower type."""
        return torch.autocast(device_type="hpu", dtype=AUTOCAST_DTYPES[self.precision])

    @override
    def forward_context(self) -> AbstractContextManager:
        return self.autocast_context_manager()

    @override
    def convert_module(self, module: Module) -> Module:
        self._install_op_lists()
        return super().convert_module(module)

    @override
    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            self._restore_op_lists()

    def _install_op_lists(self) -> None:
        if self.verbose:
            rank_zero_info(f"HPU autocast to {AUTOCAST_DTYPES[self.precision]} with op lists {self.op_list_files}")
        if self._environment_before is not None or not any(self.op_list_files.values()):
            return
        self._environment_before = {variable: os.environ.get(variable) for variable in _INSTALLED_VARIABLES}
        for variable, path in self.op_list_files.items():
            if path is not None:
                os.environ[variable] = path
        _apply_environment()

    def _restore_op_lists(self) -> None:
        before, self._environment_before = self._environment_before, None
        if before is None:
            return
        _set_environment({variable: before[variable] for variable in _OP_LIST_VARIABLES.values()})
        # the bridge reads the lists again (the defaults, or those the environment named before), and records the
        # mode, which is put back after it
        _apply_environment()
        _set_environment({"PT_HPU_LAZY_MODE": before["PT_HPU_LAZY_MODE"]})


def _apply_environment() -> None:
    """Have Gaudi's bridge read the op lists that ``LOWER_LIST`` and ``FP32_LIST`` name."""
    import habana_frameworks.torch.core as htcore

    htcore.hpu_set_env()


def _set_environment(values: dict[str, Optional[str]]) -> None:
    for variable, value in values.items():
        if value is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = value


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
    """Check that an op-list file exists and names only real ops, so a typo fails now rather than mid-training."""
    if path is None:
        return None
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
