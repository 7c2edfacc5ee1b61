"""All-reduces per step of data-parallel training on 2 HPUs: torch's DDP options against the ones Intel recommends for
HCCL, which ``hpu_parallel`` uses unless told otherwise.

A small transformer (6 encoder layers, width 512: 19.9 M parameters, 76 MiB of fp32 gradients) is fitted with
``pl.Trainer(accelerator="hpu", devices=2)`` twice per repetition, in a fresh pair of processes each time (the order
flipping every repetition):

- ``torch``: ``HPUParallelStrategy(bucket_cap_mb=25, gradient_as_bucket_view=False)``, DDP's own defaults, what a
  CUDA script moved to Gaudi got before;
- ``gaudi``: ``HPUParallelStrategy()``, whose defaults are optimum-habana's and Model-References'
  (``bucket_cap_mb=230``, ``gradient_as_bucket_view=True``; sources in ``docs/source-pytorch/hpu_intermediate.rst``).

Per steady step (after the first 2) it prints rank 0's all-reduce calls and the MiB the collectives sent, counted by
the virtual Gaudi's HCCL (``virtual_hpu.accounting``; a real Gaudi has no such counter and prints ``-``), and the
milliseconds per step. Ratios, one value per repetition: all-reduces per step gaudi ÷ torch (target ≤ 0.6; measured
on torch 2.13: 3 calls become 1), MiB per step gaudi ÷ torch (target ≤ 1.0: the same gradients, in fewer calls) and
step time gaudi ÷ torch (no target on the virtual Gaudi, whose collectives cost host copies only). Last line
``allreduce_calls_ratio=<float>``.

    python benchmarks/ddp_collectives.py [--fast] [--repeats N] [--steps N]
"""

import json
import os
import subprocess
import sys
import time
from argparse import SUPPRESS, ArgumentParser
from typing import Optional

from _common import CHILD_TIMEOUT, QUIET_TRAINER, is_virtual, print_table, spread, summarize, use_gaudi_or_virtual

use_gaudi_or_virtual()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pytorch_lightning as pl  # noqa: E402
from pytorch_lightning.strategies import HPUParallelStrategy  # noqa: E402

WIDTH, LAYERS, HEADS, SEQUENCE, BATCH, VOCABULARY = 512, 6, 8, 32, 4, 1000
WARMUP = 2
VARIANTS = {"torch": {"bucket_cap_mb": 25, "gradient_as_bucket_view": False}, "gaudi": {}}
TARGETS = {"all-reduces per step": 0.6, "collective MiB per step": 1.0, "ms per step": None}
COUNTED = {"all_reduces": ("all-reduces per step", 1), "collective_bytes": ("collective MiB per step", 2**20)}


class SmallTransformer(pl.LightningModule):
    """A token classifier: embedding, ``LAYERS`` encoder layers, a linear head; AdamW."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCABULARY)

    def training_step(self, batch: tuple, index: int) -> torch.Tensor:
        tokens, targets = batch
        logits = self.head(self.encoder(self.embedding(tokens)))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class StepCounts(pl.Callback):
    """Rank 0's collective counters and clock at the start of every training step, and its DDP module's options."""

    def __init__(self) -> None:
        self.samples: list = []
        self.options: tuple = ()

    def on_train_start(self, trainer: pl.Trainer, *args: object) -> None:
        ddp = trainer.strategy.model  # the DistributedDataParallel module, during the fit
        self.options = ddp.bucket_bytes_cap // 2**20, ddp.gradient_as_bucket_view

    def on_train_batch_start(self, *args: object) -> None:
        self.samples.append((time.perf_counter(), _counters()))

    def per_step(self) -> dict:
        """Milliseconds and counter increments per step after the first ``WARMUP`` ones."""
        steady = self.samples[WARMUP:]
        steps = len(steady) - 1
        result = {"ms per step": (steady[-1][0] - steady[0][0]) * 1000 / steps}
        if steady[0][1]:
            for key, (name, unit) in COUNTED.items():
                result[name] = (steady[-1][1][key] - steady[0][1][key]) / steps / unit
        return result


def _counters() -> dict:
    if not is_virtual():
        return {}
    from virtual_hpu import accounting

    return accounting.counters()


def worker(variant: str, steps: int) -> None:
    """One fit of ``variant`` on 2 HPUs; rank 0 prints its figures as one JSON line."""
    pl.seed_everything(0, verbose=False)
    generator = torch.Generator().manual_seed(1)
    rows = 2 * BATCH * (WARMUP + steps + 1)
    tokens = torch.randint(0, VOCABULARY, (rows, SEQUENCE), generator=generator)
    data = DataLoader(TensorDataset(tokens, tokens.roll(1, dims=1)), batch_size=BATCH)
    counts = StepCounts()
    strategy = HPUParallelStrategy(**VARIANTS[variant])
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=2,
        strategy=strategy,
        max_steps=WARMUP + steps + 1,
        callbacks=[counts],
        **QUIET_TRAINER,
    )
    trainer.fit(SmallTransformer(), data)
    if trainer.global_rank == 0:
        print(json.dumps({"variant": variant, "options": counts.options, **counts.per_step()}), flush=True)


def fit(variant: str, steps: int) -> dict:
    """A fit of ``variant`` in a fresh process, which Lightning's launcher joins with a second rank."""
    command = [sys.executable, __file__, "--worker", variant, "--steps", str(steps)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT, env=os.environ)
    if result.returncode != 0:
        raise RuntimeError(f"the {variant} fit failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="one repetition of 3 steps")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--worker", choices=VARIANTS, help=SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps)
        return
    repeats, steps = (1, 3) if args.fast else (args.repeats, args.steps)
    fits: dict = {variant: [] for variant in VARIANTS}
    for repeat in range(repeats):
        order = list(VARIANTS) if repeat % 2 == 0 else list(reversed(VARIANTS))
        for variant in order:
            fits[variant].append(fit(variant, steps))
    print(
        f"2 processes, {LAYERS}-layer transformer of width {WIDTH} ({_parameters() / 1e6:.1f} M parameters), batch"
        f" {BATCH}x{SEQUENCE} tokens per process, AdamW; {repeats} fit(s) of {steps} steady steps per variant"
    )
    header = ["variant", "bucket_cap_mb", "gradient_as_bucket_view", *TARGETS]
    rows = []
    for variant, results in fits.items():
        cells = [_cell(results, name) for name in TARGETS]
        rows.append([variant, results[0]["options"][0], results[0]["options"][1], *cells])
    print_table(header, rows)
    headline: Optional[float] = None
    for name, target in TARGETS.items():
        if name not in fits["gaudi"][0]:
            continue
        ratios = [gaudi[name] / torch_[name] for gaudi, torch_ in zip(fits["gaudi"], fits["torch"])]
        ratio = summarize(f"{name}: gaudi ÷ torch", ratios, target)
        if name == "all-reduces per step":
            headline = ratio.median
    print(f"allreduce_calls_ratio={headline if headline is not None else float('nan'):.3f}")


def _cell(results: list, name: str) -> str:
    values = [result[name] for result in results if name in result]
    return spread(values) if values else "-"


def _parameters() -> int:
    return sum(parameter.numel() for parameter in SmallTransformer().parameters())


if __name__ == "__main__":
    main()
