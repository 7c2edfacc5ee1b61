"""Precision of DeepSpeed on Intel Gaudi: the engine's fp32, bf16 or fp16 training, and fp8 for Transformer Engine
modules."""

from contextlib import AbstractContextManager
from typing import Union

from lightning.pytorch.plugins.precision.deepspeed import DeepSpeedPrecision
from torch.nn import Module
from typing_extensions import override

from pytorch_lightning.plugins.precision import hpu_fp8
from pytorch_lightning.plugins.precision.hpu import _validate_precision


class HPUDeepSpeedPrecisionPlugin(hpu_fp8.FP8Conversion, DeepSpeedPrecision):
    """Upstream's ``DeepSpeedPrecision`` with the precisions Gaudi supports.

    With ``"bf16-mixed"`` or ``"16-mixed"`` (Gaudi2 and newer) DeepSpeed's engine keeps the model in bf16/fp16 and
    fp32 master weights in its optimizer; floating-point inputs are cast to that type. Backward, the optimizer step and
    gradient clipping are the engine's. ``Trainer(strategy="hpu_deepspeed", precision=...)`` creates it; upstream's
    ``DeepSpeedPrecision`` passed in ``plugins`` with HPU becomes this plugin.
    With ``"fp8"`` (Gaudi2 and newer) the engine works in bf16 as for ``"bf16-mixed"``, and Transformer Engine modules
    compute in fp8; :meth:`convert_modules` puts them in place of the model's linear layers, as
    :meth:`HPUPrecisionPlugin.convert_modules <pytorch_lightning.plugins.HPUPrecisionPlugin.convert_modules>` does,
    or prepares it for fp8 inference (quantized models run with ZeRO stages 0 to 2).

    Args:
        precision: ``"32-true"``, ``"bf16-mixed"``, ``"16-mixed"``, ``"fp8"``, or a legacy form (32, 16, ``"bf16"``).
    """

    def __init__(self, precision: Union[str, int] = "32-true") -> None:
        validated = _validate_precision(precision)
        # under fp8, DeepSpeed's engine holds the model and casts the inputs as for bf16
        super().__init__("bf16-mixed" if validated == "fp8" else validated)  # type: ignore[arg-type]
        self.precision = validated

    @override
    def convert_module(self, module: Module) -> Module:
        if self.precision == "fp8":
            self.say_if_nothing_computes_in_fp8(module)
        return super().convert_module(module)

    @override
    def forward_context(self) -> AbstractContextManager:
        if self.precision == "fp8":
            return hpu_fp8.fp8_training_context(self.recipe)
        return super().forward_context()
