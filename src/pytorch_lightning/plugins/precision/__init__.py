"""Upstream's ``lightning.pytorch.plugins.precision`` plus Gaudi precision."""

import lightning.pytorch.plugins.precision as _upstream

from pytorch_lightning import _aliasing
from pytorch_lightning.plugins.precision.hpu import HPUPrecisionPlugin
from pytorch_lightning.plugins.precision.hpu_deepspeed import HPUDeepSpeedPrecisionPlugin

__all__ = ["HPUDeepSpeedPrecisionPlugin", "HPUPrecisionPlugin"]

_aliasing.extend_upstream(__name__, _upstream)
