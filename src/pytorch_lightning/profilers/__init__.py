"""Upstream's ``lightning.pytorch.profilers`` plus the Intel Gaudi profiler."""

import lightning.pytorch.profilers as _upstream

from _lightning_hpu import aliasing as _aliasing
from pytorch_lightning.profilers.hpu import HPUProfiler

__all__ = ["HPUProfiler"]

_aliasing.extend_upstream(__name__, _upstream)
