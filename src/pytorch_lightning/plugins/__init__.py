"""Upstream's ``lightning.pytorch.plugins`` plus the Intel Gaudi plugins."""

import lightning.pytorch.plugins as _upstream

from _lightning_hpu import aliasing as _aliasing
from pytorch_lightning.plugins.io import HPUCheckpointIO
from pytorch_lightning.plugins.precision import (
    HPUDeepSpeedPrecisionPlugin,
    HPUFP8InferencePrecision,
    HPUFP8Precision,
    HPUFSDPPrecision,
    HPUHalfPrecision,
    HPUMixedPrecision,
    HPUPrecisionPlugin,
)

__all__ = [
    "HPUCheckpointIO",
    "HPUDeepSpeedPrecisionPlugin",
    "HPUFP8InferencePrecision",
    "HPUFP8Precision",
    "HPUFSDPPrecision",
    "HPUHalfPrecision",
    "HPUMixedPrecision",
    "HPUPrecisionPlugin",
]

_aliasing.extend_upstream(__name__, _upstream)
