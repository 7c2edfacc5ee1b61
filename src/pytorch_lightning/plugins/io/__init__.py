"""Upstream's ``lightning.pytorch.plugins.io`` plus Gaudi checkpoint I/O."""

import lightning.pytorch.plugins.io as _upstream

from _lightning_hpu import aliasing as _aliasing
from pytorch_lightning.plugins.io.hpu import HPUCheckpointIO

__all__ = ["HPUCheckpointIO"]

_aliasing.extend_upstream(__name__, _upstream)
