"""Upstream's ``lightning.pytorch.callbacks`` plus the progress bars the Trainer uses by default on HPUs and the HPU
performance report."""

import lightning.pytorch.callbacks as _upstream

from _lightning_hpu import aliasing as _aliasing
from pytorch_lightning.callbacks.hpu_performance import HPUPerformanceMonitor, PerformanceReport
from pytorch_lightning.callbacks.hpu_progress import HPURichProgressBar, HPUTQDMProgressBar

__all__ = ["HPUPerformanceMonitor", "HPURichProgressBar", "HPUTQDMProgressBar", "PerformanceReport"]

_aliasing.extend_upstream(__name__, _upstream)
