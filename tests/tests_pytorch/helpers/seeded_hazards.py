"""Fits with one seeded Gaudi performance hazard each, reported by ``HPUPerformanceMonitor`` into a JSON file.

    python seeded_hazards.py OUT.json [--compile] [--devices N] HAZARD [HAZARD ...]

Hazards: clean, item, print, branch, progress_bar, ragged (a smaller last batch), shapes (batch sizes that change every
step). Each line that causes a hazard ends with a ``# hazard: <name>`` comment, so that tests can find its number.
"""

import json
import os
import sys
from argparse import ArgumentParser
from dataclasses import asdict

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pytorch_lightning as pl
from pytorch_lightning.callbacks import HPUPerformanceMonitor

BATCH = 16


class Seeded(pl.LightningModule):
    def __init__(self, hazard: str) -> None:
        super().__init__()
        self.hazard = hazard
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        if self.hazard == "item" and self.global_rank == self.trainer.world_size - 1:
            self.last_loss = loss.item()  # hazard: item
        elif self.hazard == "print":
            print(loss)  # hazard: print
        elif self.hazard == "branch":
            if loss > 0:  # hazard: branch
                loss = loss * 1.0
        elif self.hazard == "progress_bar":
            self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader(hazard: str) -> DataLoader:
    rows = BATCH * 8 + (5 if hazard == "ragged" else 0)
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(rows, 16, generator=generator), torch.randint(0, 2, (rows,), generator=generator))
    if hazard == "shapes":
        # batches of 8, 9, ..., 13 rows in turn
        sizes, start, batches = [8 + i % 6 for i in range(12)], 0, []
        for size in sizes:
            batches.append(list(range(start, start + size)))
            start += size
        return DataLoader(data, batch_sampler=batches)
    return DataLoader(data, batch_size=BATCH)


def run(hazard: str, compiled: bool, devices: int) -> dict:
    # each fit compiles afresh, as it would in a process of its own (dynamo caches code objects, not models)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, monitor = Seeded(hazard), HPUPerformanceMonitor()
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=devices,
        strategy="hpu_parallel" if devices > 1 else "auto",
        max_epochs=2,
        callbacks=[monitor],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=hazard == "progress_bar",
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    runner = torch.compile(model, backend="hpu_backend") if compiled else model
    trainer.fit(runner, _loader(hazard))
    report = monitor.report()
    result = asdict(report)
    result["clean"], result["text"] = report.clean, str(report)
    result["training_batches"] = trainer.num_training_batches
    return result


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("hazards", nargs="+")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--devices", type=int, default=1)
    args = parser.parse_args()
    results = {hazard: run(hazard, args.compile, args.devices) for hazard in args.hazards}
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        with open(args.out, "w") as file:
            json.dump(results, file, default=str)


if __name__ == "__main__":
    sys.exit(main())
