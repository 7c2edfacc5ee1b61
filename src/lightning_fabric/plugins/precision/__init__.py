"""Upstream's ``lightning.fabric.plugins.precision`` plus the Intel Gaudi precision plugins for Fabric."""

import lightning.fabric.plugins.precision as _upstream

from _lightning_hpu import aliasing as _aliasing
from lightning_fabric.plugins.precision.hpu import (
    HPUDeepSpeedPrecision,
    HPUFP8Precision,
    HPUFSDPPrecision,
    HPUHalfPrecision,
    HPUMixedPrecision,
    HPUPrecision,
)

__all__ = [
    "HPUDeepSpeedPrecision",
    "HPUFP8Precision",
    "HPUFSDPPrecision",
    "HPUHalfPrecision",
    "HPUMixedPrecision",
    "HPUPrecision",
]

_aliasing.extend_upstream(__name__, _upstream)
