"""Waits for the HPU before upstream's ``ThroughputMonitor`` reads the clock."""

from typing import Any

import torch
from lightning.pytorch.callbacks import Callback, ThroughputMonitor
from typing_extensions import override


class HPUThroughputSync(Callback):
    """Placed by the Trainer right before each ``ThroughputMonitor`` when it trains on HPUs: at the end of every batch
    it waits for the HPU to finish the batch's work (``torch.hpu.synchronize()``), so that the time the monitor reads
    next is the device's, as upstream makes it wait for CUDA devices (and only for them). Gaudi runs a step's work
    after the host queued it: without the wait, the monitor would time the host and report throughput and MFU the
    device never reached."""

    @override
    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        torch.hpu.synchronize()

    @override
    def on_validation_batch_end(self, *args: Any, **kwargs: Any) -> None:
        torch.hpu.synchronize()

    @override
    def on_test_batch_end(self, *args: Any, **kwargs: Any) -> None:
        torch.hpu.synchronize()

    @override
    def on_predict_batch_end(self, *args: Any, **kwargs: Any) -> None:
        torch.hpu.synchronize()


def synchronize_before_throughput_monitors(callbacks: list[Callback]) -> None:
    """Put an :class:`HPUThroughputSync` right before each ``ThroughputMonitor`` of ``callbacks`` that has none."""
    for index in reversed(range(len(callbacks))):
        previous = callbacks[index - 1] if index > 0 else None
        if isinstance(callbacks[index], ThroughputMonitor) and not isinstance(previous, HPUThroughputSync):
            callbacks.insert(index, HPUThroughputSync())
