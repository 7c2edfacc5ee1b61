"""Precision of FSDP on Intel Gaudi in the Trainer: FSDP's ``MixedPrecision`` (parameter, reduce and buffer dtypes)
with Gaudi's autocast."""

from typing import Union

from lightning.pytorch.plugins.precision.fsdp import FSDPPrecision
from torch.optim import Optimizer
from typing_extensions import override

from lightning_fabric.plugins.precision.hpu_fsdp import HPUFSDPPrecision as FabricHPUFSDPPrecision
from pytorch_lightning.plugins.precision.hpu import HPUPrecisionPlugin


class HPUFSDPPrecision(FabricHPUFSDPPrecision, HPUPrecisionPlugin, FSDPPrecision):
    """Upstream's ``FSDPPrecision`` on HPUs: Fabric's :class:`lightning_fabric.plugins.HPUFSDPPrecision` (the dtypes of
    FSDP's shards, reductions and buffers, with Gaudi's autocast) with the Trainer's hooks; it takes the same arguments.

    ``Trainer(accelerator="hpu", strategy="fsdp", precision=...)`` builds it.
    """

    @override
    def clip_grad_by_norm(self, optimizer: Optimizer, clip_val: Union[int, float]) -> None:
        # upstream's (it refuses: each process holds shards), not the fused clip of the HPU plugins it follows
        FSDPPrecision.clip_grad_by_norm(self, optimizer, clip_val)
