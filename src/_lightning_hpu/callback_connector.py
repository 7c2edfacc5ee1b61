"""Upstream's Trainer callback connector, with what every Trainer shows on HPUs: the HPU line, the HPU progress bar,
throughput timed on the device."""

from datetime import timedelta
from typing import TYPE_CHECKING, Optional, Union

from lightning.pytorch.callbacks import Callback, ProgressBar
from lightning.pytorch.trainer.connectors.callback_connector import _CallbackConnector
from lightning.pytorch.utilities.rank_zero import rank_zero_info

if TYPE_CHECKING:
    from lightning.pytorch import Trainer


class HPUCallbackConnector(_CallbackConnector):
    """``lightning.pytorch.trainer.connectors.callback_connector._CallbackConnector`` that, on HPUs, puts the HPU
    progress bar where upstream puts its default one, waits for the HPU before each ``ThroughputMonitor`` reads its
    clock, and logs the HPU line.

    Every ``Trainer`` builds it, ``lightning.Trainer`` as much as ``pytorch_lightning.Trainer``, right after its
    accelerator connector, so both look the same on a Gaudi. Upstream's device lines (GPU, TPU) come right after it.
    The HPU classes are imported when a ``Trainer`` is built: this module is loaded while ``lightning`` itself is still
    being imported.
    """

    def on_trainer_init(
        self,
        callbacks: Optional[Union[list[Callback], Callback]],
        enable_checkpointing: bool,
        enable_progress_bar: bool,
        default_root_dir: Optional[str],
        enable_model_summary: bool,
        max_time: Optional[Union[str, timedelta, dict[str, int]]] = None,
    ) -> None:
        super().on_trainer_init(
            callbacks, enable_checkpointing, enable_progress_bar, default_root_dir, enable_model_summary, max_time
        )
        _time_throughput_on_the_device(self.trainer)
        _log_hpu_info(self.trainer)

    def _configure_progress_bar(self, enable_progress_bar: bool = True) -> None:
        given = any(isinstance(callback, ProgressBar) for callback in self.trainer.callbacks)
        super()._configure_progress_bar(enable_progress_bar)
        if not given:
            _use_hpu_progress_bar(self.trainer)


def _use_hpu_progress_bar(trainer: "Trainer") -> None:
    """On HPUs, the progress bar upstream added by default becomes ours, which reads the values logged with
    ``prog_bar=True`` every ``log_every_n_steps`` steps instead of after every step, each read waiting for the HPU. A
    bar the user passed is kept, and none is added where upstream adds none (``enable_progress_bar=False``)."""
    from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

    from lightning_fabric.accelerators.hpu import HPUAccelerator
    from pytorch_lightning.callbacks.hpu_progress import HPURichProgressBar, HPUTQDMProgressBar

    bar = trainer.progress_bar_callback
    if bar is None or not isinstance(trainer.accelerator, HPUAccelerator):
        return
    ours = {RichProgressBar: HPURichProgressBar, TQDMProgressBar: HPUTQDMProgressBar}.get(type(bar))
    if ours is not None:
        callbacks = trainer.callbacks
        callbacks[callbacks.index(bar)] = ours()


def _time_throughput_on_the_device(trainer: "Trainer") -> None:
    """On HPUs, each ``ThroughputMonitor`` the user passed gets an ``HPUThroughputSync`` right before it."""
    from lightning_fabric.accelerators.hpu import HPUAccelerator
    from pytorch_lightning.callbacks._hpu_throughput_sync import synchronize_before_throughput_monitors

    if isinstance(trainer.accelerator, HPUAccelerator):
        synchronize_before_throughput_monitors(trainer.callbacks)


def _log_hpu_info(trainer: "Trainer") -> None:
    """Whether a Gaudi is available, which, and how many HPUs the run uses, in the form of upstream's GPU and TPU
    lines."""
    from lightning_fabric.accelerators.hpu import HPUAccelerator

    available = HPUAccelerator.is_available()
    kind = f" ({HPUAccelerator.describe()})" if available else ""
    used = trainer.num_devices if isinstance(trainer.accelerator, HPUAccelerator) else 0
    rank_zero_info(f"HPU available: {available}{kind}, using: {used} HPUs")
