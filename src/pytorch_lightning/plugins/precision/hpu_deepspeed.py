"""Precision of DeepSpeed on Intel Gaudi in the Trainer: the engine's fp32, bf16 or fp16 training, and fp8 for
Transformer Engine modules."""

from lightning.pytorch.plugins.precision.deepspeed import DeepSpeedPrecision

from lightning_fabric.plugins.precision.hpu_deepspeed import HPUDeepSpeedMixin
from pytorch_lightning.plugins.precision.hpu import HPUPrecisionPlugin


class HPUDeepSpeedPrecisionPlugin(HPUDeepSpeedMixin, DeepSpeedPrecision, HPUPrecisionPlugin):
    """Upstream's ``DeepSpeedPrecision`` with the precisions Gaudi supports: Fabric's
    :class:`lightning_fabric.plugins.precision.hpu_deepspeed.HPUDeepSpeedMixin` on the Trainer's ``DeepSpeedPrecision``,
    whose backward, optimizer step and gradient clipping are the engine's. It takes the arguments of Fabric's
    :class:`lightning_fabric.plugins.precision.hpu_deepspeed.HPUDeepSpeedPrecision`.

    ``Trainer(strategy="hpu_deepspeed", precision=...)`` builds it; upstream's ``DeepSpeedPrecision`` passed in
    ``plugins`` with HPU becomes this plugin.
    """

    _entry_point = "HPUDeepSpeedPrecisionPlugin"
