"""fp8 training on Gaudi2 and newer in the Trainer: Intel Gaudi's Transformer Engine modules compute in fp8 inside
``fp8_autocast``, every other op follows bf16 autocast."""

from lightning_fabric.plugins.precision.hpu_fp8 import HPUFP8Precision as FabricHPUFP8Precision
from pytorch_lightning.plugins.precision.hpu_mixed import HPUMixedPrecision


class HPUFP8Precision(FabricHPUFP8Precision, HPUMixedPrecision, builds=("fp8",)):
    """fp8 training on HPUs (Gaudi2 and newer) with Gaudi's Transformer Engine: Fabric's
    :class:`lightning_fabric.plugins.HPUFP8Precision` with the Trainer's hooks; it takes the same arguments.

    With ``replace_layers=True`` the model's ``torch.nn.Linear`` layers become Transformer Engine ``Linear`` layers
    when the Trainer sets the model up, so ``Trainer(plugins=[HPUFP8Precision(replace_layers=True)])`` is all a model
    needs. ``Trainer(precision="fp8")`` and ``HPUPrecisionPlugin(precision="fp8", ...)`` build it too.
    """
