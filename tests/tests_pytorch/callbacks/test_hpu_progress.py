"""The Trainer's default progress bar on HPUs reads logged values every few steps, not after every step."""

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ProgressBar, RichProgressBar, TQDMProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pytorch_lightning as pl
from pytorch_lightning.callbacks import HPURichProgressBar, HPUTQDMProgressBar
from tests_pytorch.helpers.runif import RunIf

DEFAULT_BAR = HPURichProgressBar if _RICH_AVAILABLE else HPUTQDMProgressBar


class LoggingModel(pl.LightningModule):
    """Logs its loss to the progress bar every step and counts host syncs at the start of each step."""

    def __init__(self) -> None:
        super().__init__()
        self.network = nn.Linear(8, 2)
        self.host_syncs: list = []

    def on_train_batch_start(self, batch, batch_idx):
        from virtual_hpu import accounting

        self.host_syncs.append(accounting.counters()["host_syncs"])

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = nn.functional.cross_entropy(self.network(inputs), targets)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(steps: int, **trainer_kwargs) -> LoggingModel:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(steps * 4, 8), torch.randint(0, 2, (steps * 4,)))
    model = LoggingModel()
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        **trainer_kwargs,
    )
    trainer.fit(model, DataLoader(data, batch_size=4))
    return model


def _syncs_per_step(model: LoggingModel) -> list:
    return [later - earlier for earlier, later in zip(model.host_syncs, model.host_syncs[1:])]


def _bars(trainer: pl.Trainer) -> list:
    return [callback for callback in trainer.callbacks if isinstance(callback, ProgressBar)]


def test_default_progress_bar_on_hpu():
    trainer = pl.Trainer(accelerator="hpu", devices=1, logger=False)
    assert type(trainer.progress_bar_callback) is DEFAULT_BAR
    assert len(_bars(trainer)) == 1


@pytest.mark.parametrize("as_list", [True, False])
def test_progress_bar_of_the_user_is_kept(as_list):
    bar = TQDMProgressBar(refresh_rate=5)
    trainer = pl.Trainer(accelerator="hpu", devices=1, logger=False, callbacks=[bar] if as_list else bar)
    assert _bars(trainer) == [bar]


def test_no_progress_bar_when_disabled_and_upstream_default_elsewhere():
    assert _bars(pl.Trainer(accelerator="hpu", devices=1, logger=False, enable_progress_bar=False)) == []
    # upstream's own default: Rich when `rich` is installed (DeepSpeed and transformers bring it), else TQDM
    upstream_default = RichProgressBar if _RICH_AVAILABLE else TQDMProgressBar
    assert type(pl.Trainer(accelerator="cpu", logger=False).progress_bar_callback) is upstream_default


@pytest.mark.parametrize("rate", [0, -1, True])
def test_metrics_refresh_rate_is_validated(rate):
    with pytest.raises(ValueError, match="must be a positive number of steps"):
        HPUTQDMProgressBar(metrics_refresh_rate=rate)


@RunIf(virtual_hpu=True)
def test_reads_logged_values_every_n_steps():
    steps = 14
    without_bar = _syncs_per_step(_fit(steps, enable_progress_bar=False))
    upstream = _syncs_per_step(_fit(steps, callbacks=[TQDMProgressBar()]))
    ours = _syncs_per_step(_fit(steps, callbacks=[HPUTQDMProgressBar(metrics_refresh_rate=4)]))
    # upstream's bar reads the logged loss after every step
    assert [a - b for a, b in zip(upstream, without_bar)] == [1] * (steps - 1)
    # ours at the first step and after every 4th
    expected = [1 if batch_idx == 0 or (batch_idx + 1) % 4 == 0 else 0 for batch_idx in range(steps - 1)]
    assert [a - b for a, b in zip(ours, without_bar)] == expected


@RunIf(virtual_hpu=True)
def test_default_bar_reads_every_log_every_n_steps():
    steps = 14
    without_bar = _syncs_per_step(_fit(steps, enable_progress_bar=False, log_every_n_steps=5))
    default = _syncs_per_step(_fit(steps, log_every_n_steps=5))
    expected = [1 if batch_idx == 0 or (batch_idx + 1) % 5 == 0 else 0 for batch_idx in range(steps - 1)]
    assert [a - b for a, b in zip(default, without_bar)] == expected


class RecordPostfix(Callback):
    """Placed after the bar: what it shows after every step."""

    def __init__(self, bar: HPUTQDMProgressBar) -> None:
        self.bar, self.shown = bar, []

    def on_train_batch_end(self, *args):
        self.shown.append(self.bar.train_progress_bar.postfix)


@RunIf(virtual_hpu=True)  # counts host syncs, which the virtual Gaudi records
def test_bar_shows_the_last_values_read_and_the_final_ones_at_epoch_end():
    bar = HPUTQDMProgressBar(metrics_refresh_rate=3)
    record = RecordPostfix(bar)
    steps = 7
    data = TensorDataset(torch.randn(steps * 4, 8), torch.randint(0, 2, (steps * 4,)))
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[bar, record],
    )
    trainer.fit(LoggingModel(), DataLoader(data, batch_size=4))
    read_steps = {0, 2, 5}
    assert all("loss=" in shown for shown in record.shown)
    assert all(record.shown[i] == record.shown[i - 1] for i in range(1, steps) if i not in read_steps)
    # the epoch's end shows the last step's loss
    assert bar.train_progress_bar.postfix == f"loss={trainer.progress_bar_metrics['loss']:.3f}"
