"""Train a few steps on HPUs and print, as JSON, the virtual Gaudi's counter increments per steady-state step.

Run as a script so that each run gets a fresh device in the lazy or eager mode its environment asks for.
``--log`` logs the loss to the progress bar every step; ``--log-every-n-steps`` sets the Trainer's flag;
``--devices N --strategy NAME`` trains on N processes, each printing its line (with its ``rank``).
"""

import json
import os
import sys
from argparse import ArgumentParser

from lightning.pytorch.demos.boring_classes import BoringModel

import pytorch_lightning as pl


class CountingModel(BoringModel):
    """Snapshots the counters at the start of every training step."""

    def __init__(self, log_every_step: bool) -> None:
        super().__init__()
        self.log_every_step = log_every_step
        self.snapshots = []

    def training_step(self, batch, batch_idx):
        from virtual_hpu import accounting

        self.snapshots.append(accounting.counters())
        output = super().training_step(batch, batch_idx)
        if self.log_every_step:
            self.log("loss", output["loss"], prog_bar=True)
        return output

    def on_train_end(self) -> None:
        # here, in the process that trained (spawned ones included); one write per line, as ranks share the output
        line = json.dumps({"rank": self.global_rank, **per_step(self.snapshots)})
        os.write(sys.stdout.fileno(), f"{line}\n".encode())


def per_step(snapshots: list, warmup: int = 2) -> dict:
    """Counter increments between consecutive steps after ``warmup`` steps, as sets of distinct values."""
    steady = snapshots[warmup:]
    return {
        key: sorted({later[key] - earlier[key] for earlier, later in zip(steady, steady[1:])})
        for key in ("mark_steps", "host_syncs", "graphs", "ops")
    }


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("--log", action="store_true")
    parser.add_argument("--log-every-n-steps", type=int, default=50)
    parser.add_argument("--progress-bar", action="store_true")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--strategy", default="auto")
    args = parser.parse_args()
    model = CountingModel(args.log)
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=args.devices,
        strategy=args.strategy,
        max_steps=args.steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=args.progress_bar,
        log_every_n_steps=args.log_every_n_steps,
    )
    trainer.fit(model)


if __name__ == "__main__":
    main()
