"""Precision of DeepSpeed on Intel Gaudi in the Trainer: the engine's fp32, bf16 or fp16 training, and fp8 for
Transformer Engine modules."""

from lightning.pytorch.plugins.precision.deepspeed import DeepSpeedPrecision

from lightning_fabric.plugins.precision.hpu_deepspeed import HPUDeepSpeedMixin
from pytorch_lightning.plugins.precision.hpu import HPUPrecisionPlugin


class HPUDeepSpeedPrecisionPlugin(HPUDeepSpeedMixin, DeepSpeedPrecision, HPUPrecisionPlugin):
    """Upstream's ``DeepSpeedPrecision`` with the precisions Gaudi supports: Fabric's
    :class:`lightning_fabric.plugins.precision.hpu_deepspeed.HPUDeepSpeedMixin` on the Trainer's ``DeepSpeedPrecision``,
    whose backward, optimizer step and gradient clipping are the engine's.

    ``Trainer(strategy="hpu_deepspeed", precision=...)`` builds it; upstream's ``DeepSpeedPrecision`` passed in
    ``plugins`` with HPU becomes this plugin.

    Args:
        precision: ``"32-true"``, ``"bf16-mixed"``, ``"16-mixed"``, ``"bf16-true"``, ``"16-true"``, ``"fp8"``, or a
            legacy form (32, 16, ``"bf16"``).
        device: ``"hpu"`` (lightning-habana's signature, ``HPUDeepSpeedPrecisionPlugin(precision, device="hpu")``).
        recipe: for ``"fp8"``: a ``DelayedScaling`` recipe or its arguments as a dict.
        replace_layers: for ``"fp8"``: put Transformer Engine ``Linear`` layers in place of the model's linear layers
            at set-up.
    """

    _entry_point = "HPUDeepSpeedPrecisionPlugin"
