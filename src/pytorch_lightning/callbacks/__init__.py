"""Upstream's ``lightning.pytorch.callbacks`` plus the progress bars the Trainer uses by default on HPUs."""

import lightning.pytorch.callbacks as _upstream

from pytorch_lightning import _aliasing
from pytorch_lightning.callbacks.hpu_progress import HPURichProgressBar, HPUTQDMProgressBar

__all__ = ["HPURichProgressBar", "HPUTQDMProgressBar"]

_aliasing.extend_upstream(__name__, _upstream)
