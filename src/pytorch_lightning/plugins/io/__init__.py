"""Upstream's ``lightning.pytorch.plugins.io`` plus Gaudi checkpoint I/O (Fabric's, as upstream's ``TorchCheckpointIO``
serves both)."""

import lightning.pytorch.plugins.io as _upstream

from _lightning_hpu import aliasing as _aliasing
from lightning_fabric.plugins.io import HPUCheckpointIO

__all__ = ["HPUCheckpointIO"]

_aliasing.extend_upstream(__name__, _upstream)
