"""True half precision on Intel Gaudi in the Trainer: the model's weights, its floating-point inputs and the tensors
created in ``forward`` in bf16 or fp16, without autocast."""

from lightning.pytorch.plugins.precision.half import HalfPrecision

from lightning_fabric.plugins.precision.hpu_half import HPUHalfPrecision as FabricHPUHalfPrecision
from pytorch_lightning.plugins.precision.hpu import HPUPrecisionPlugin


class HPUHalfPrecision(FabricHPUHalfPrecision, HPUPrecisionPlugin, HalfPrecision, builds=("bf16-true", "16-true")):
    """Upstream's ``HalfPrecision`` on HPUs: ``"bf16-true"``, or ``"16-true"`` on Gaudi2 and newer.

    ``Trainer(accelerator="hpu", precision="bf16-true")`` builds it. The precisions mean what they mean on every other
    device; a first-generation Gaudi refuses fp16 here, when the plugin is built.
    """
