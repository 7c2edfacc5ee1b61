"""HPU graphs inside a LightningModule, as docs/source-pytorch/hpu_graphs.rst shows them: a training step captured once
and replayed (manual optimization), and ``predict`` through ``wrap_in_hpu_graph``. Lazy mode, where Gaudi runs them."""

import habana_frameworks.torch as ht
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pytorch_lightning as pl

BATCH = 64


def _digits(shuffle: bool, drop_last: bool) -> DataLoader:
    images, labels = load_digits(return_X_y=True)
    dataset = TensorDataset(torch.tensor(images / 16.0, dtype=torch.float32), torch.tensor(labels))
    return DataLoader(dataset, batch_size=BATCH, shuffle=shuffle, drop_last=drop_last)


class DigitsClassifier(pl.LightningModule):
    """Trains eagerly, or (``hpu_graphs=True``) with its training step captured into an HPU graph at the second step
    and replayed from the third on; the first step is an eager warm-up that creates the optimizer's state."""

    def __init__(self, hpu_graphs: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10))
        self.automatic_optimization = False
        self.hpu_graphs = hpu_graphs
        self.losses: list[torch.Tensor] = []
        self.graph = ht.hpu.HPUGraph()
        self.static_loss = None

    def forward(self, x):
        return self.net(x)

    def on_fit_start(self) -> None:
        # the graph reads its inputs from these tensors: each batch is copied in, so their memory stays the same
        self.static_x = torch.zeros(BATCH, 64, device=self.device)
        self.static_y = torch.zeros(BATCH, dtype=torch.long, device=self.device)

    def _step(self, x, y):
        optimizer = self.optimizers()
        loss = F.cross_entropy(self(x), y)
        self.manual_backward(loss)
        optimizer.step()
        return loss

    def training_step(self, batch, batch_idx):
        x, y = batch
        optimizer = self.optimizers()
        if not self.hpu_graphs:
            optimizer.zero_grad(set_to_none=True)
            loss = self._step(x, y)
        else:
            self.static_x.copy_(x)
            self.static_y.copy_(y)
            if self.global_step == 0:  # warm-up
                optimizer.zero_grad(set_to_none=True)
                loss = self._step(self.static_x, self.static_y)
            elif self.static_loss is None:  # capture: runs the step once and records it
                optimizer.zero_grad(set_to_none=True)
                with ht.hpu.graph(self.graph):
                    self.static_loss = self._step(self.static_x, self.static_y)
                loss = self.static_loss
            else:  # replay: forward, backward and optimizer step on the batch just copied in
                self.graph.replay()
                loss = self.static_loss
        self.losses.append(loss.detach().clone())
        self.log("train_loss", loss)

    def predict_step(self, batch, batch_idx):
        x, _ = batch
        return self(x)

    def configure_optimizers(self):
        return torch.optim.Adadelta(self.parameters(), lr=1.0)


class GraphedPredictions(DigitsClassifier):
    def on_predict_start(self) -> None:
        # one graph per batch shape; the smaller last batch gets its own
        ht.hpu.wrap_in_hpu_graph(self.net, disable_tensor_cache=True)


def _trainer(tmp_path, **kwargs) -> pl.Trainer:
    return pl.Trainer(
        accelerator="hpu",
        devices=1,
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        **kwargs,
    )


def _fit(tmp_path, hpu_graphs: bool) -> DigitsClassifier:
    pl.seed_everything(0)
    model = DigitsClassifier(hpu_graphs)
    _trainer(tmp_path, max_epochs=1, limit_train_batches=12).fit(model, _digits(shuffle=True, drop_last=True))
    return model


@pytest.mark.parametrize("hpu_mode", ["lazy"])
def test_a_captured_training_step_trains_like_eager(tmp_path, hpu_mode):
    eager = _fit(tmp_path, hpu_graphs=False)
    graphed = _fit(tmp_path, hpu_graphs=True)
    eager_losses = [loss.item() for loss in eager.losses]
    graphed_losses = [loss.item() for loss in graphed.losses]
    assert len(graphed_losses) == 12
    assert graphed_losses == eager_losses
    assert graphed_losses[-1] < graphed_losses[0] - 0.1, graphed_losses  # it learns: 2.30 -> 2.09
    for graphed_param, eager_param in zip(graphed.parameters(), eager.parameters()):
        torch.testing.assert_close(graphed_param, eager_param, rtol=0, atol=0)


@pytest.mark.parametrize("hpu_mode", ["lazy"])
def test_predict_through_wrap_in_hpu_graph_equals_eager(tmp_path, hpu_mode, monkeypatch):
    replays = []
    replay = ht.hpu.HPUGraph.replay
    monkeypatch.setattr(ht.hpu.HPUGraph, "replay", lambda graph, *args: replays.append(graph) or replay(graph, *args))
    pl.seed_everything(1)
    model = GraphedPredictions(hpu_graphs=False)
    loader = _digits(shuffle=False, drop_last=False)  # 1797 digits: 28 batches of 64 and one of 5
    eager = DigitsClassifier(hpu_graphs=False)
    eager.load_state_dict(model.state_dict())
    expected = _trainer(tmp_path).predict(eager, loader)
    assert not replays
    predictions = _trainer(tmp_path).predict(model, loader)
    assert len(predictions) == len(expected) == 29 and predictions[-1].shape == (5, 10)
    assert len(replays) == 29 - 2  # all but the first batch of each shape, which was captured
    for graphed_batch, eager_batch in zip(predictions, expected):
        torch.testing.assert_close(graphed_batch, eager_batch, rtol=0, atol=0)
    assert len({p.data_ptr() for p in predictions}) == len(predictions)  # each batch's result, not the static output
