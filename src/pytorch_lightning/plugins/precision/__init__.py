"""Upstream's ``lightning.pytorch.plugins.precision`` plus Gaudi precision."""

import lightning.pytorch.plugins.precision as _upstream

from _lightning_hpu import aliasing as _aliasing
from pytorch_lightning.plugins.precision.hpu import HPUPrecisionPlugin
from pytorch_lightning.plugins.precision.hpu_deepspeed import HPUDeepSpeedPrecisionPlugin
from pytorch_lightning.plugins.precision.hpu_fp8 import HPUFP8Precision
from pytorch_lightning.plugins.precision.hpu_fp8_inference import HPUFP8InferencePrecision
from pytorch_lightning.plugins.precision.hpu_fsdp import HPUFSDPPrecision
from pytorch_lightning.plugins.precision.hpu_half import HPUHalfPrecision
from pytorch_lightning.plugins.precision.hpu_mixed import HPUMixedPrecision

__all__ = [
    "HPUDeepSpeedPrecisionPlugin",
    "HPUFP8InferencePrecision",
    "HPUFP8Precision",
    "HPUFSDPPrecision",
    "HPUHalfPrecision",
    "HPUMixedPrecision",
    "HPUPrecisionPlugin",
]

_aliasing.extend_upstream(__name__, _upstream)
