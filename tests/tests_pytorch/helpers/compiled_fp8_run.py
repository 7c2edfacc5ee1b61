"""Train a model with odd layer sizes in fp8 (layers replaced at set-up), eagerly and compiled with
``torch.compile(backend="hpu_backend")``, on a simulated AMX host; print each run's per-step losses and graph
compilations so far as one JSON line. Run in eager mode (``PT_HPU_LAZY_MODE=0``), with ``tests/`` on the path."""

import json

import torch
from torch import nn

import pytorch_lightning as pl
from pytorch_lightning.plugins import HPUPrecisionPlugin
from tests_virtual_hpu.amx_host import simulated_amx_host


class OddShapes(pl.LightningModule):
    """Linear layers whose sizes are not multiples of 16, which CUDA's fp8 GEMM would refuse."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(13, 37), nn.ReLU(), nn.Linear(37, 5))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        features, labels = batch
        return nn.functional.cross_entropy(self(features), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(1)
        features = torch.randn(96, 13, generator=generator)
        labels = torch.randint(0, 5, (96,), generator=generator)
        return torch.utils.data.DataLoader(list(zip(features, labels)), batch_size=8)


def _graph_compilations() -> int:
    from habana_frameworks.torch.hpu.metrics import metric_global

    return dict(metric_global("graph_compilation").stats())["TotalNumber"]


class CountsCompilations(pl.Callback):
    """The losses and the compilations so far after each step (outside the step, which Lightning compiles too)."""

    def __init__(self) -> None:
        self.after_step, self.losses = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after_step.append(_graph_compilations())
        self.losses.append(outputs["loss"].item())


def run(compiled: bool) -> dict:
    from habana_frameworks.torch.hpex.experimental import transformer_engine as te

    model, counter = OddShapes(), CountsCompilations()
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        plugins=[HPUPrecisionPlugin("fp8", recipe={"fp8_format": "HYBRID"}, replace_layers=True)],
        max_steps=12,
        callbacks=[counter],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(torch.compile(model, backend="hpu_backend") if compiled else model)
    converted = isinstance(model.net[0], te.Linear) and isinstance(model.net[2], te.Linear)
    return {"losses": counter.losses, "compilations": counter.after_step, "converted": converted}


if __name__ == "__main__":
    with simulated_amx_host():
        print(json.dumps({"eager": run(compiled=False), "compiled": run(compiled=True)}))
