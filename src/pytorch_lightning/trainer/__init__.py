"""Upstream's ``lightning.pytorch.trainer`` with our HPU-aware ``Trainer``."""

import lightning.pytorch.trainer as _upstream

from _lightning_hpu import aliasing as _aliasing
from pytorch_lightning.trainer.trainer import Trainer

__all__ = ["Trainer"]

_aliasing.extend_upstream(__name__, _upstream)
