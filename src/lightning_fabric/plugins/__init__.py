"""Upstream's ``lightning.fabric.plugins`` plus the Intel Gaudi precision plugins and checkpoint I/O for Fabric."""

import lightning.fabric.plugins as _upstream

from _lightning_hpu import aliasing as _aliasing
from lightning_fabric.plugins.io import HPUCheckpointIO
from lightning_fabric.plugins.precision import (
    HPUDeepSpeedPrecision,
    HPUFP8InferencePrecision,
    HPUFP8Precision,
    HPUFSDPPrecision,
    HPUHalfPrecision,
    HPUMixedPrecision,
    HPUPrecision,
)

__all__ = [
    "HPUCheckpointIO",
    "HPUDeepSpeedPrecision",
    "HPUFP8InferencePrecision",
    "HPUFP8Precision",
    "HPUFSDPPrecision",
    "HPUHalfPrecision",
    "HPUMixedPrecision",
    "HPUPrecision",
]

_aliasing.extend_upstream(__name__, _upstream)
