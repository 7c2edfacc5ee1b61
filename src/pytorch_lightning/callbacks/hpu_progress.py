"""Progress bars that read logged values from the HPU every few steps instead of after every step."""

from typing import Any, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override


class _ReadsMetricsEveryNSteps:
    """Mixed into a progress bar, before it: the values logged with ``prog_bar=True`` are read from the device at the
    first training step of each epoch, every ``metrics_refresh_rate`` steps, and at the end of each epoch and of each
    validation; in between, the bar shows the values it read last. The step count moves as before.

    Showing a value means copying it to the host, and on Gaudi that waits for the device to finish the step: a bar
    that reads after every step stops the host from queueing the next step while the device works.
    """

    def __init__(self, *args: Any, metrics_refresh_rate: Optional[int] = None, **kwargs: Any) -> None:
        if metrics_refresh_rate is not None and (isinstance(metrics_refresh_rate, bool) or metrics_refresh_rate < 1):
            raise ValueError(
                f"`metrics_refresh_rate={metrics_refresh_rate!r}` must be a positive number of steps, or None to read"
                " the logged values every `Trainer(log_every_n_steps=...)` steps."
            )
        super().__init__(*args, **kwargs)
        self.metrics_refresh_rate = metrics_refresh_rate
        self._reuse_metrics = False
        self._shown_metrics: Optional[dict[str, Any]] = None

    @override
    def on_train_batch_end(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        every = self.metrics_refresh_rate or trainer.log_every_n_steps
        self._reuse_metrics = batch_idx > 0 and (batch_idx + 1) % every != 0
        try:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # type: ignore[misc]
        finally:
            self._reuse_metrics = False

    @override
    def get_metrics(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> dict[str, Any]:
        if not self._reuse_metrics or self._shown_metrics is None:
            self._shown_metrics = super().get_metrics(trainer, pl_module)  # type: ignore[misc]
        return dict(self._shown_metrics)


class HPUTQDMProgressBar(_ReadsMetricsEveryNSteps, TQDMProgressBar):
    """Upstream's :class:`~lightning.pytorch.callbacks.TQDMProgressBar` that reads the logged values it shows every
    ``metrics_refresh_rate`` training steps (default: the Trainer's ``log_every_n_steps``) rather than after every
    step, since each read waits for the HPU. The Trainer's default progress bar on HPUs.

    Args:
        metrics_refresh_rate: training steps between reads of the logged values; the other arguments are
            ``TQDMProgressBar``'s (``refresh_rate``, ``process_position``, ``leave``).
    """


class HPURichProgressBar(_ReadsMetricsEveryNSteps, RichProgressBar):
    """Upstream's :class:`~lightning.pytorch.callbacks.RichProgressBar` that reads the logged values it shows every
    ``metrics_refresh_rate`` training steps (default: the Trainer's ``log_every_n_steps``); the Trainer's default
    progress bar on HPUs when ``rich`` is installed.

    Args:
        metrics_refresh_rate: training steps between reads of the logged values; the other arguments are
            ``RichProgressBar``'s (``refresh_rate``, ``leave``, ``theme``, ``console_kwargs``).
    """
