"""``trainer.fit(torch.compile(model, backend="hpu_backend"))``: the default path of current Gaudi software."""

import pytest
import torch
from habana_frameworks.torch.hpu.metrics import metric_global
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pytorch_lightning as pl


class LoggingRegressor(pl.LightningModule):
    """Logs in every step, as most LightningModules do (this is what broke compiled modules on torch >= 2.12)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 1))
        self.losses: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def _loss(self, batch: tuple) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x).float(), y)

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss)
        return loss

    def on_train_batch_end(self, outputs: dict, batch: tuple, batch_idx: int) -> None:
        # outside the compiled step: appending there would be a side effect dynamo guards on, recompiling every step
        self.losses.append(outputs["loss"].detach())

    def validation_step(self, batch: tuple, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch))

    def test_step(self, batch: tuple, batch_idx: int) -> None:
        self.log("test_loss", self._loss(batch))

    def predict_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _data() -> DataLoader:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(32, 8, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def _trainer(tmp_path, **kwargs) -> pl.Trainer:
    arguments = dict(accelerator="hpu", devices=1, max_epochs=2, precision="bf16-mixed", logger=False)
    arguments.update(default_root_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False, **kwargs)
    return pl.Trainer(**arguments)


pytestmark = pytest.mark.usefixtures("fresh_compilation_state")


def test_compiled_module_trains_like_eager_through_every_stage(tmp_path):
    eager = LoggingRegressor()
    _trainer(tmp_path / "eager").fit(eager, _data(), _data())
    assert dict(metric_global("graph_compilation").stats())["TotalNumber"] == 0

    model = LoggingRegressor()
    trainer = _trainer(tmp_path / "compiled")
    trainer.fit(torch.compile(model, backend="hpu_backend"), _data(), _data())
    compilations = dict(metric_global("graph_compilation").stats())["TotalNumber"]
    # validation step forward, training step forward and backward: equal batches compile once, never again
    assert compilations == 3
    torch.testing.assert_close(torch.stack(model.losses).cpu(), torch.stack(eager.losses).cpu(), rtol=2e-2, atol=1e-3)
    assert {"train_loss", "val_loss"} <= set(trainer.callback_metrics)

    (tested,) = trainer.test(torch.compile(model, backend="hpu_backend"), _data(), verbose=False)
    assert tested["test_loss"] > 0
    predictions = trainer.predict(torch.compile(model, backend="hpu_backend"), _data())
    assert len(predictions) == 4 and predictions[0].shape == (8, 1)
    # the test and predict steps are compiled once each
    assert dict(metric_global("graph_compilation").stats())["TotalNumber"] == compilations + 2

    path = trainer.checkpoint_callback.best_model_path
    checkpoint = torch.load(path, weights_only=False)
    assert all(not key.startswith("_orig_mod") for key in checkpoint["state_dict"])
    resumed_model = LoggingRegressor()
    resumed = _trainer(tmp_path / "compiled", max_epochs=3)
    resumed.fit(torch.compile(resumed_model, backend="hpu_backend"), _data(), _data(), ckpt_path=path)
    assert resumed.current_epoch == 3
    assert len(resumed_model.losses) == 4  # only the third epoch ran
