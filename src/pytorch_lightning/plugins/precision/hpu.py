"""Precision for Intel Gaudi: fp32, mixed precision through ``torch.autocast("hpu")`` with Gaudi's op lists, or
weights and inputs in bf16/fp16."""

import os
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Optional, Union

import torch
from lightning.fabric.connector import _convert_precision_to_unified_args
from lightning.pytorch.plugins.precision.half import HalfPrecision
from lightning.pytorch.plugins.precision.precision import Precision
from lightning.pytorch.utilities.rank_zero import WarningCache, rank_zero_info
from torch.nn import Module
from typing_extensions import override

from pytorch_lightning.plugins.precision import hpu_fp8

_SUPPORTED = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "fp8")
# fp8 runs what Transformer Engine does not cover in bf16 autocast, with the op lists
_AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16, "fp8": torch.bfloat16}
_HALF = ("bf16-true", "16-true")
# Lightning 1.x's spellings of Habana mixed precision, which ran in bf16 on every Gaudi
_LEGACY_16 = ("16", 16)
_LEGACY_16_NOTE = (
    "`precision=16` on HPU means bf16 mixed precision (`'bf16-mixed'`), as in Lightning 1.x. For float16 autocast"
    " (Gaudi2 and newer), pass `precision='16-mixed'`."
)
_info_cache = WarningCache()
# first-generation Gaudi has no fp16 and no fp8
_NEEDS_GAUDI2 = {"16-mixed": "bf16-mixed", "16-true": "bf16-true", "fp8": "bf16-mixed"}
# the keys of the ``hmp_params`` dict of earlier Lightning releases, and the arguments they stand for
_HMP_PARAMS = {"level": "opt_level", "verbose": "verbose", "bf16_ops": "bf16_file_path", "fp32_ops": "fp32_file_path"}
# Gaudi's autocast reads its lower-precision and fp32 op lists from the files these variables name
_OP_LIST_VARIABLES = {"bf16_file_path": "LOWER_LIST", "fp32_file_path": "FP32_LIST"}
# what installing the op lists sets in the process environment (the bridge records the mode too); put back at teardown
_INSTALLED_VARIABLES = ("LOWER_LIST", "FP32_LIST", "PT_HPU_LAZY_MODE")


class HPUPrecisionPlugin(hpu_fp8.FP8Conversion, Precision):
    """Mixed precision on HPUs with Gaudi's autocast, plain fp32, or weights and inputs in bf16/fp16.

    ``Trainer(accelerator="hpu", precision="bf16-mixed")`` (or ``"16-mixed"``, ``"bf16"``, ``"bf16-true"``,
    ``"16-true"``, ``"fp8"``; ``16`` and ``"16"`` mean ``"bf16-mixed"`` here, as in Lightning 1.x) creates it; pass it
    in ``plugins`` to choose which ops run in lower precision and which stay in fp32.
    The ``-true`` precisions mean what they mean on every other device: the module's parameters, the floating-point
    inputs and the tensors created in ``forward`` are in that type, without autocast.
    ``"fp8"`` (Gaudi2 and newer) trains Transformer Engine modules in fp8 and every other op in bf16 autocast;
    :meth:`convert_modules` puts such modules in place of the model's linear layers, or prepares the model for fp8
    inference with Intel Neural Compressor (measurement, then quantization in a later process).

    Args:
        precision: ``"32-true"``, ``"bf16-mixed"``, ``"16-mixed"`` (Gaudi2 and newer), ``"bf16-true"``, ``"16-true"``
            (Gaudi2 and newer), ``"fp8"`` (Gaudi2 and newer), or a legacy form (``16`` and ``"16"`` are
            ``"bf16-mixed"``).
        opt_level: ``"O1"``: ops in the lower-precision list run in bf16/fp16, ops in the fp32 list in fp32, all
            others in the type of their inputs.
        bf16_file_path: a text file with one op name per line to run in lower precision (Gaudi's ``LOWER_LIST``).
        fp32_file_path: a text file with one op name per line to keep in fp32 (Gaudi's ``FP32_LIST``).
        verbose: log the op lists in effect.
        hmp_params: the same settings as a dict with keys ``level``, ``verbose``, ``bf16_ops`` and ``fp32_ops``.
    """

    def __init__(
        self,
        precision: Union[str, int] = "32-true",
        opt_level: str = "O1",
        bf16_file_path: Optional[str] = None,
        fp32_file_path: Optional[str] = None,
        verbose: bool = False,
        hmp_params: Optional[dict[str, Any]] = None,
    ) -> None:
        self.precision = _validate_precision(precision)
        # upstream's own plugin for the ``-true`` half precisions, so that they mean exactly what they mean elsewhere
        self._half = HalfPrecision(self.precision) if self.precision in _HALF else None
        settings = {
            "opt_level": opt_level,
            "verbose": verbose,
            "bf16_file_path": bf16_file_path,
            "fp32_file_path": fp32_file_path,
        }
        settings.update(_settings_from_hmp_params(hmp_params, explicit=settings))
        if settings["opt_level"] != "O1":
            raise ValueError(
                f"`HPUPrecisionPlugin(opt_level={settings['opt_level']!r})` is not supported: Gaudi's autocast"
                " implements 'O1' (op lists). Use `opt_level='O1'` and list the ops to lower in `bf16_file_path`."
            )
        self.verbose = bool(settings["verbose"])
        self.op_list_files = {
            variable: _validated_op_list(settings[argument] or os.environ.get(variable), argument, variable)
            for argument, variable in _OP_LIST_VARIABLES.items()
        }
        self._environment_before = {variable: os.environ.get(variable) for variable in _INSTALLED_VARIABLES}
        if self.precision in _AUTOCAST_DTYPES:
            if any(self.op_list_files.values()):
                _install_op_lists(self.op_list_files)
            if self.verbose:
                rank_zero_info(f"HPU autocast to {_AUTOCAST_DTYPES[self.precision]} with op lists {self.op_list_files}")

    def autocast_context_manager(self) -> AbstractContextManager:
        """``torch.autocast("hpu")`` in lower precision, around Transformer Engine's ``fp8_autocast`` for fp8;
        nothing for fp32."""
        if self.precision == "fp8":
            return hpu_fp8.fp8_training_context(self.recipe)
        if self.precision not in _AUTOCAST_DTYPES:
            return nullcontext()
        return torch.autocast(device_type="hpu", dtype=_AUTOCAST_DTYPES[self.precision])

    @override
    def forward_context(self) -> AbstractContextManager:
        if self._half is not None:
            return self._half.forward_context()
        return self.autocast_context_manager()

    @override
    def convert_module(self, module: Module) -> Module:
        if self.precision == "fp8":
            self.say_if_nothing_computes_in_fp8(module)
        return module if self._half is None else self._half.convert_module(module)

    @override
    def tensor_init_context(self) -> AbstractContextManager:
        return super().tensor_init_context() if self._half is None else self._half.tensor_init_context()

    @override
    def module_init_context(self) -> AbstractContextManager:
        return super().module_init_context() if self._half is None else self._half.module_init_context()

    @override
    def convert_input(self, data: Any) -> Any:
        return data if self._half is None else self._half.convert_input(data)

    @override
    def teardown(self) -> None:
        """Leave the environment as construction found it; processes launched by the strategy have inherited it."""
        super().teardown()
        for variable, value in self._environment_before.items():
            if value is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = value


def _validate_precision(precision: Union[str, int]) -> str:
    if type(precision) in (str, int) and precision in _LEGACY_16:
        _info_cache.info(_LEGACY_16_NOTE)
        return "bf16-mixed"
    try:
        unified = "fp8" if precision == "fp8" else _convert_precision_to_unified_args(precision)
    except ValueError:
        unified = None
    if unified not in _SUPPORTED:
        reason = " Gaudi has no float64." if unified == "64-true" else ""
        raise ValueError(
            f"`precision={precision!r}` is not supported on HPU.{reason} Choose one of"
            f" {', '.join(map(repr, _SUPPORTED))} (or the legacy forms 32, 16, '16', 'bf16')."
        )
    if unified in _NEEDS_GAUDI2:
        import habana_frameworks.torch.hpu as hthpu

        if hthpu.get_device_name() == "GAUDI":
            raise ValueError(
                f"`precision={unified!r}` needs Gaudi2 or newer: first-generation Gaudi has no fp16 and no fp8."
                f" Use `precision={_NEEDS_GAUDI2[unified]!r}` instead."
            )
    return unified


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


def _install_op_lists(files: dict[str, Optional[str]]) -> None:
    """Point Gaudi's autocast at the op-list files and have the bridge apply them before the first autocast region."""
    for variable, path in files.items():
        if path is not None:
            os.environ[variable] = path
    import habana_frameworks.torch.core as htcore

    htcore.hpu_set_env()
