"""Upstream's ``lightning.pytorch.plugins.precision`` plus Gaudi precision."""

import lightning.pytorch.plugins.precision as _upstream

from pytorch_lightning import _aliasing
from pytorch_lightning.plugins.precision.hpu import HPUPrecisionPlugin

__all__ = ["HPUPrecisionPlugin"]

_aliasing.extend_upstream(__name__, _upstream)
