"""``DeviceStatsMonitor`` logs Gaudi's memory statistics when training on HPU."""

from lightning.pytorch.callbacks import DeviceStatsMonitor
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import Logger

import pytorch_lightning as pl
from tests_pytorch.helpers.gaudi import GAUDI_MEMORY_KEYS


class RecordingLogger(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.metrics = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics, step=None) -> None:
        self.metrics.append(metrics)

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


def test_device_stats_monitor_logs_gaudi_memory_keys(tmp_path):
    logger = RecordingLogger()
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        max_steps=3,
        limit_val_batches=0,
        log_every_n_steps=1,
        callbacks=[DeviceStatsMonitor()],
        logger=logger,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_checkpointing=False,
    )
    trainer.fit(BoringModel())
    logged = {key: value for metrics in logger.metrics for key, value in metrics.items()}
    for hook in ("on_train_batch_start", "on_train_batch_end"):
        for key in GAUDI_MEMORY_KEYS:
            assert f"DeviceStatsMonitor.{hook}/{key}" in logged
    assert logged["DeviceStatsMonitor.on_train_batch_end/InUse"] > 0
    assert (
        logged["DeviceStatsMonitor.on_train_batch_end/Limit"]
        >= logged["DeviceStatsMonitor.on_train_batch_end/MaxInUse"]
    )
