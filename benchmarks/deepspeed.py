"""DeepSpeed ZeRO-2 in bf16 on 2 processes: the HPU against the CPU, and the Trainer against a hand-written loop.

Three kinds of fit train the same MLP with AdamW from the same seed on the same rows (each rank its own half of every
global batch):

- ``loop hpu``: the loop a DeepSpeed user writes (``deepspeed.initialize``, ``engine.backward``, ``engine.step``) on
  the HPU over HCCL, with DeepSpeed's HPU accelerator;
- ``loop cpu``: the same loop on the CPU over gloo, with DeepSpeed's CPU accelerator;
- ``trainer hpu``: ``pl.Trainer(accelerator="hpu", devices=2, strategy="hpu_deepspeed_stage_2",
  precision="bf16-mixed")``.

This script starts the two processes itself (as ``torchrun`` would; Lightning joins them), and each runs every kind in
turn, the order swapping every repeat, each fit with its own process group: machine noise hits every kind alike. Per
kind it prints median [min, max] milliseconds per step on rank 0 after warm-up and the final loss, and two ratios,
each the median over repetitions of the ratio of the median step times of the repetition's two fits, with min and max:
``loop hpu ÷ loop cpu``, what the device costs DeepSpeed (target <= 1.05 on the virtual Gaudi, where both run the
host's kernels), and ``trainer hpu ÷ loop hpu``, what Lightning adds (target <= 1.05 at >= 20 ms per step). Both pairs
must end with the same loss and weights, bit for bit. Last line ``deepspeed_ratio_max=<float>``, the larger of the two
median ratios.

    python benchmarks/deepspeed.py [--fast] [--repeats N] [--steps N]
"""

import hashlib
import json
import os
import time
import warnings
from argparse import SUPPRESS, ArgumentParser
from typing import Any

from _common import (
    fit_groups,
    interleaved,
    launch_pair,
    print_table,
    rank_rows,
    spread,
    step_ratios,
    summarize,
    use_gaudi_or_virtual,
)

use_gaudi_or_virtual()

import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import pytorch_lightning as pl  # noqa: E402

WIDTH, BATCH, CLASSES, RANKS = 512, 64, 10, 2
WARMUP = 3
DEVICE_TARGET, LIGHTNING_TARGET = 1.05, 1.05
KINDS = ("loop hpu", "loop cpu", "trainer hpu")
# what Lightning's DeepSpeed strategy configures for ZeRO stage 2, written out as a DeepSpeed user would
ZERO_2 = {
    "stage": 2,
    "contiguous_gradients": True,
    "overlap_comm": True,
    "allgather_partitions": True,
    "reduce_scatter": True,
    "allgather_bucket_size": 200_000_000,
    "reduce_bucket_size": 200_000_000,
}


def network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, CLASSES)
    )


def digest(module: nn.Module) -> str:
    """A fingerprint of the module's weights, equal only when they are equal bit for bit."""
    weights = b"".join(p.detach().float().cpu().numpy().tobytes() for p in module.parameters())
    return hashlib.sha1(weights).hexdigest()[:12]


def use_accelerator(device: str) -> None:
    """DeepSpeed places its buffers and picks its collective backend by its one global accelerator."""
    from deepspeed.accelerator import get_accelerator, set_accelerator

    if get_accelerator().device_name() != device:
        if device == "hpu":
            from deepspeed.accelerator.hpu_accelerator import HPU_Accelerator as Accelerator
        else:
            from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator as Accelerator
        set_accelerator(Accelerator())


def loop(device: str, steps: int, rank: int) -> dict:
    """``steps`` steps of a hand-written DeepSpeed loop on ``device``; per-step start times and the final loss."""
    import deepspeed

    use_accelerator(device)
    if device == "hpu":
        import habana_frameworks.torch.distributed.hccl  # noqa: F401  (registers the backend)
    deepspeed.init_distributed(dist_backend="hccl" if device == "hpu" else "gloo")
    model = network()
    config = {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": ZERO_2,
        "zero_allow_untested_optimizer": True,
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    target = torch.device(device, rank) if device == "hpu" else torch.device("cpu")
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, dist_init_required=False)
    starts, loss = [], None
    for inputs, targets in DataLoader(rank_rows(steps, rank, BATCH, WIDTH, CLASSES, RANKS), batch_size=BATCH):
        starts.append(time.perf_counter())
        inputs, targets = inputs.to(target, torch.bfloat16), targets.to(target)
        loss = nn.functional.cross_entropy(engine(inputs), targets)
        engine.backward(loss)
        engine.step()
    result = {"starts": starts, "loss": loss.float().item(), "weights": digest(engine.module)}
    deepspeed.comm.destroy_process_group()
    return result


class Recorder(pl.Callback):
    """Start time of every training step, and the last loss."""

    def __init__(self) -> None:
        self.starts: list = []
        self.loss = float("nan")

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self.starts.append(time.perf_counter())

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, *args: Any) -> None:
        self.loss = outputs["loss"]


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.network = network()

    def training_step(self, batch: tuple, batch_idx: int) -> Tensor:
        inputs, targets = batch
        return nn.functional.cross_entropy(self.network(inputs), targets)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def fit(steps: int, rank: int) -> dict:
    """The same training with ``pl.Trainer`` and ``strategy="hpu_deepspeed_stage_2"``."""
    import deepspeed

    recorder = Recorder()
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=RANKS,
        strategy="hpu_deepspeed_stage_2",
        precision="bf16-mixed",
        max_steps=steps,
        use_distributed_sampler=False,  # each rank already has its own rows, as in the loop
        callbacks=[recorder],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Classifier()
    trainer.fit(model, DataLoader(rank_rows(steps, rank, BATCH, WIDTH, CLASSES, RANKS), batch_size=BATCH))
    deepspeed.comm.destroy_process_group()  # the next fit, possibly of another kind, starts its own group
    return {"starts": recorder.starts, "loss": recorder.loss.float().item(), "weights": digest(model)}


def worker(repeats: int, steps: int) -> None:
    """One of the two processes: every kind ``repeats`` times; rank 0 prints the results as one JSON line."""
    rank, next_fit = int(os.environ["LOCAL_RANK"]), fit_groups()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")

    def measure(kind: str, _: int) -> dict:
        next_fit()
        result = fit(steps, rank) if kind == "trainer hpu" else loop(kind.split()[1], steps, rank)
        starts = result["starts"][WARMUP:]
        ms = [(later - earlier) * 1000 for earlier, later in zip(starts, starts[1:])]
        return {"ms": ms, "loss": result["loss"], "weights": result["weights"]}

    results = interleaved(KINDS, repeats, measure)
    if rank == 0:
        print(json.dumps(results))


def _yes(condition: bool) -> str:
    return "yes" if condition else "no"


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="one short fit of each kind (smoke test)")
    parser.add_argument("--repeats", type=int, default=10, help="fits of each kind")
    parser.add_argument("--steps", type=int, default=25, help="training steps per fit")
    parser.add_argument("--worker", action="store_true", help=SUPPRESS)
    args = parser.parse_args()
    repeats, steps = (1, WARMUP + 4) if args.fast else (args.repeats, args.steps)
    if args.worker:
        worker(repeats, steps)
        return

    results = launch_pair(__file__, ["--repeats", str(repeats), "--steps", str(steps)])
    rows = []
    for kind, fits in results.items():
        ms = [value for result in fits for value in result["ms"]]
        rows.append([kind, spread(ms), f"{fits[-1]['loss']:.6f}", fits[-1]["weights"]])
    device_ratios = step_ratios(results, "loop hpu", "loop cpu")
    lightning_ratios = step_ratios(results, "trainer hpu", "loop hpu")
    ends = {kind: [(result["loss"], result["weights"]) for result in fits] for kind, fits in results.items()}
    print(
        f"{RANKS} processes, ZeRO stage 2, bf16, {repeats} fit(s) x {steps} steps per kind, first {WARMUP} steps left"
        f" out; MLP {WIDTH}x{WIDTH}x{WIDTH}x{CLASSES}, batch {BATCH} per process, AdamW"
    )
    print_table(["kind", "ms/step (rank 0)", "final loss", "weights (sha1)"], rows)
    device = summarize("loop hpu ÷ loop cpu", device_ratios, DEVICE_TARGET)
    lightning = summarize("trainer hpu ÷ loop hpu", lightning_ratios, LIGHTNING_TARGET)
    for first, second in (("loop hpu", "loop cpu"), ("trainer hpu", "loop hpu")):
        print(f"final losses and weights bitwise equal, {first} and {second}: {_yes(ends[first] == ends[second])}")
    print(f"deepspeed_ratio_max={max(device.median, lightning.median):.3f}")


if __name__ == "__main__":
    main()
