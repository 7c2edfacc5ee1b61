"""Upstream's ``lightning.fabric.plugins.io`` plus Gaudi checkpoint I/O, which the Trainer uses too."""

import lightning.fabric.plugins.io as _upstream

from _lightning_hpu import aliasing as _aliasing
from lightning_fabric.plugins.io.hpu import HPUCheckpointIO

__all__ = ["HPUCheckpointIO"]

_aliasing.extend_upstream(__name__, _upstream)
