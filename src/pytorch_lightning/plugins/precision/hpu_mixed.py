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
    """Upstream's ``MixedPrecision`` on HPUs: ``torch.autocast("hpu")`` in bf16 (``"bf16-mixed"``) or fp16
    (``"16-mixed"``, Gaudi2 and newer), with Gaudi's op lists deciding which ops run in lower precision and which stay
    in fp32, and without loss scaling.

    ``Trainer(accelerator="hpu", precision="bf16-mixed")`` builds it; pass it in ``plugins`` to give op lists.
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
