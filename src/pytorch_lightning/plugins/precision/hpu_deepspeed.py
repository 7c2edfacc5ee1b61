"""Precision of DeepSpeed on Intel Gaudi: the engine's fp32, bf16 or fp16 training."""

from typing import Union

from lightning.pytorch.plugins.precision.deepspeed import DeepSpeedPrecision

from pytorch_lightning.plugins.precision.hpu import _validate_precision


class HPUDeepSpeedPrecisionPlugin(DeepSpeedPrecision):
    """Upstream's ``DeepSpeedPrecision`` with the precisions Gaudi supports.

    With ``"bf16-mixed"`` or ``"16-mixed"`` (Gaudi2 and newer) DeepSpeed's engine keeps the model in bf16/fp16 and
    fp32 master weights in its optimizer; floating-point inputs are cast to that type. Backward, the optimizer step and
    gradient clipping are the engine's. ``Trainer(strategy="hpu_deepspeed", precision=...)`` creates it; upstream's
    ``DeepSpeedPrecision`` passed in ``plugins`` with HPU becomes this plugin.

    Args:
        precision: ``"32-true"``, ``"bf16-mixed"`` or ``"16-mixed"``, or a legacy form (32, 16, ``"bf16"``).
    """

    def __init__(self, precision: Union[str, int] = "32-true") -> None:
        validated = _validate_precision(precision)
        if validated == "fp8":
            raise ValueError(
                "fp8 under DeepSpeed (`precision='fp8'` with an HPU DeepSpeed strategy) is not available in this"
                " release. Train with `precision='bf16-mixed'` under DeepSpeed, or in fp8 with 'hpu_single' or"
                " 'hpu_parallel'."
            )
        super().__init__(validated)  # type: ignore[arg-type]
