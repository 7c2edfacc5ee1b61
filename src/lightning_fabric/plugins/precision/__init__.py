"""Upstream's ``lightning.fabric.plugins.precision`` plus the Intel Gaudi precision plugins for Fabric, the bases of the
Trainer's."""

import lightning.fabric.plugins.precision as _upstream

from _lightning_hpu import aliasing as _aliasing
from lightning_fabric.plugins.precision.hpu import HPUPrecision
from lightning_fabric.plugins.precision.hpu_deepspeed import HPUDeepSpeedPrecision
from lightning_fabric.plugins.precision.hpu_fp8 import HPUFP8Precision
from lightning_fabric.plugins.precision.hpu_fp8_inference import HPUFP8InferencePrecision
from lightning_fabric.plugins.precision.hpu_fsdp import HPUFSDPPrecision
from lightning_fabric.plugins.precision.hpu_half import HPUHalfPrecision
from lightning_fabric.plugins.precision.hpu_mixed import HPUMixedPrecision

__all__ = [
    "HPUDeepSpeedPrecision",
    "HPUFP8InferencePrecision",
    "HPUFP8Precision",
    "HPUFSDPPrecision",
    "HPUHalfPrecision",
    "HPUMixedPrecision",
    "HPUPrecision",
]

_aliasing.extend_upstream(__name__, _upstream)
