"""Mixed precision on Intel Gaudi in the Trainer: ``torch.autocast("hpu")`` in bf16 or fp16, with Gaudi's op lists."""

from typing import Any, Union

from lightning.fabric.plugins.precision.precision import Precision as FabricPrecision
from lightning.pytorch.plugins.precision.amp import MixedPrecision
from lightning.pytorch.plugins.precision.precision import Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch.optim import Optimizer
from typing_extensions import override

from lightning_fabric.plugins.precision.hpu_mixed import HPUMixedPrecision as FabricHPUMixedPrecision
from pytorch_lightning.plugins.precision.hpu import HPUPrecisionPlugin


class HPUMixedPrecision(FabricHPUMixedPrecision, HPUPrecisionPlugin, MixedPrecision, builds=("bf16-mixed", "16-mixed")):
    """Upstream's ``MixedPrecision`` on HPUs: Fabric's :class:`lightning_fabric.plugins.HPUMixedPrecision` (autocast in
    bf16 or fp16 with Gaudi's op lists, no loss scaling) with the Trainer's hooks; it takes the same arguments.

    ``Trainer(accelerator="hpu", precision="bf16-mixed")`` builds it; pass it in ``plugins`` to give op lists.
    """

    @override
    def convert_input(self, data: Any) -> Any:
        # the batch reaches the steps as upstream's Trainer `MixedPrecision` leaves it; Fabric's casts it
        return FabricPrecision.convert_input(self, data)

    @override
    def clip_gradients(
        self,
        optimizer: Optimizer,
        clip_val: Union[int, float] = 0.0,
        gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM,
    ) -> None:
        # upstream refuses optimizers that unscale gradients themselves; without a scaler nothing is scaled
        Precision.clip_gradients(self, optimizer, clip_val, gradient_clip_algorithm)
