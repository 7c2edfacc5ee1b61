"""FSDP (FULL_SHARD) in bf16 on 2 processes: the HPU against the CPU, and the Trainer against a hand-written loop.

Three kinds of fit train the same MLP with AdamW from the same seed on the same rows (each rank its own half of every
global batch), with torch's ``FullyShardedDataParallel`` (FSDP1): ``FULL_SHARD``, the whole model one unit on a 1-D
device mesh, ``use_orig_params=True``, ``MixedPrecision`` in bf16 (parameters, gradient reduction, buffers) and the
forward in ``torch.autocast`` bf16:

- ``loop hpu``: the loop an FSDP user writes (``FullyShardedDataParallel(...)``, ``loss.backward()``,
  ``optimizer.step()``) on the HPU over HCCL, cutting the graph after backward and after the step in lazy mode, as
  Gaudi's documentation has it;
- ``loop cpu``: the same loop on CPU tensors over gloo;
- ``trainer hpu``: ``pl.Trainer(accelerator="hpu", devices=2, strategy="fsdp", precision="bf16-mixed")``.

This script starts the two processes itself (as ``torchrun`` would; Lightning joins them), and each runs every kind in
turn, the order swapping every repeat, each fit with its own process group: machine noise hits every kind alike. Per
kind it prints median [min, max] milliseconds per step on rank 0 after warm-up and the final loss, and two ratios,
each the median over repetitions of the ratio of the median step times of the repetition's two fits, with min and max:
``loop hpu ÷ loop cpu``, what the device costs FSDP (target <= 1.05 on the virtual Gaudi, where both run the host's
kernels), and ``trainer hpu ÷ loop hpu``, what Lightning adds (target <= 1.05; the model is sized for a step of >= 20
ms). Each pair's final losses are printed and compared.
Then a second process pair runs ``loop hpu`` and ``trainer hpu`` once each in lazy mode (``PT_HPU_LAZY_MODE=1``) and
prints graphs, graph compilations (``metric_global("graph_compilation")``) and host syncs per steady-state step on
rank 0, where the virtual Gaudi counts them. Last line ``fsdp_ratio_max=<float>``, the larger of the two median
ratios.

    python benchmarks/fsdp.py [--fast] [--repeats N] [--steps N]
"""

import json
import os
import time
import warnings
from argparse import SUPPRESS, ArgumentParser
from typing import Any

from _common import (
    QUIET_TRAINER,
    fit_groups,
    interleaved,
    is_virtual,
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
import torch.distributed as dist  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import pytorch_lightning as pl  # noqa: E402

WIDTH, BATCH, CLASSES, RANKS = 2048, 128, 10, 2
WARMUP = 3
DEVICE_TARGET, LIGHTNING_TARGET = 1.05, 1.05
KINDS = ("loop hpu", "loop cpu", "trainer hpu")
LAZY_KINDS = ("loop hpu", "trainer hpu")


def network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, CLASSES)
    )


def mixed_precision() -> Any:
    from torch.distributed.fsdp import MixedPrecision

    return MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)


class Probe:
    """Start time of every step and, in lazy mode on the virtual Gaudi, the device's counters at that moment."""

    def __init__(self, count: bool) -> None:
        self.count = count
        self.starts: list = []
        self.counters: list = []

    def __call__(self) -> None:
        self.starts.append(time.perf_counter())
        if self.count:
            from habana_frameworks.torch.hpu.metrics import metric_global

            from virtual_hpu import accounting

            counters = accounting.counters()
            counters["graph_compilation"] = dict(metric_global("graph_compilation").stats())["TotalNumber"]
            self.counters.append(counters)


def loop(device: str, steps: int, rank: int, probe: Probe) -> float:
    """``steps`` steps of a hand-written FSDP loop on ``device``; the final loss."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    cut = None
    if device == "hpu":
        import habana_frameworks.torch.core as htcore
        import habana_frameworks.torch.distributed.hccl  # noqa: F401  (registers the backend)

        cut = htcore.mark_step if htcore.is_lazy() else None
        target = torch.device("hpu", rank)
        dist.init_process_group("hccl", device_id=target)
    else:
        target = torch.device("cpu")
        dist.init_process_group("gloo")
    model = FullyShardedDataParallel(
        network(),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        mixed_precision=mixed_precision(),
        device_id=target,
        device_mesh=init_device_mesh(device, (RANKS,)),
        use_orig_params=True,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = torch.zeros(())
    for inputs, targets in DataLoader(rank_rows(steps, rank, BATCH, WIDTH, CLASSES, RANKS), batch_size=BATCH):
        probe()
        inputs, targets = inputs.to(target), targets.to(target)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        if cut:
            cut()
        optimizer.step()
        optimizer.zero_grad()
        if cut:
            cut()
    final = loss.float().item()
    dist.destroy_process_group()
    return final


class Recorder(pl.Callback):
    """Calls the probe at the start of every training step; keeps the last loss."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.loss: Any = float("nan")

    def on_train_batch_start(self, *args: Any) -> None:
        self.probe()

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


def fit(steps: int, rank: int, probe: Probe) -> float:
    """The same training with ``pl.Trainer(strategy="fsdp", precision="bf16-mixed")``; the final loss."""
    recorder = Recorder(probe)
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=RANKS,
        strategy="fsdp",
        precision="bf16-mixed",
        max_steps=steps,
        use_distributed_sampler=False,  # each rank already has its own rows, as in the loop
        callbacks=[recorder],
        **QUIET_TRAINER,
    )
    trainer.fit(Classifier(), DataLoader(rank_rows(steps, rank, BATCH, WIDTH, CLASSES, RANKS), batch_size=BATCH))
    dist.destroy_process_group()  # the next fit, possibly of another kind, starts its own group
    return recorder.loss.float().item()


def worker(kinds: tuple, repeats: int, steps: int) -> None:
    """One of the two processes: every kind ``repeats`` times; rank 0 prints the results as one JSON line."""
    rank, next_fit = int(os.environ["LOCAL_RANK"]), fit_groups()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*FSDP will always retain a full-precision copy.*")
    lazy = os.environ.get("PT_HPU_LAZY_MODE") == "1" and is_virtual()

    def measure(kind: str, _: int) -> dict:
        next_fit()
        probe = Probe(count=lazy and kind.endswith("hpu"))
        loss = fit(steps, rank, probe) if kind == "trainer hpu" else loop(kind.split()[1], steps, rank, probe)
        starts = probe.starts[WARMUP:]
        result = {"ms": [(later - earlier) * 1000 for earlier, later in zip(starts, starts[1:])], "loss": loss}
        if probe.counters:
            first, last = probe.counters[WARMUP], probe.counters[-1]
            count = len(probe.counters) - 1 - WARMUP
            keys = ("graphs", "graph_compilation", "host_syncs", "mark_steps")
            result["per_step"] = {key: (last[key] - first[key]) / count for key in keys}
        return result

    results = interleaved(kinds, repeats, measure)
    if rank == 0:
        print(json.dumps(results))


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="one short fit of each kind (smoke test)")
    parser.add_argument("--repeats", type=int, default=8, help="fits of each kind")
    parser.add_argument("--steps", type=int, default=25, help="training steps per fit")
    parser.add_argument("--worker", help=SUPPRESS)
    args = parser.parse_args()
    repeats, steps = (1, WARMUP + 4) if args.fast else (args.repeats, args.steps)
    if args.worker:
        worker(tuple(args.worker.split(",")), repeats, steps)
        return

    results = launch_pair(__file__, [",".join(KINDS), "--repeats", str(repeats), "--steps", str(steps)])
    rows = []
    for kind, fits in results.items():
        ms = [value for result in fits for value in result["ms"]]
        rows.append([kind, spread(ms), f"{fits[-1]['loss']:.6f}"])
    device_ratios = step_ratios(results, "loop hpu", "loop cpu")
    lightning_ratios = step_ratios(results, "trainer hpu", "loop hpu")
    print(
        f"{RANKS} processes, FSDP FULL_SHARD, bf16 mixed, {repeats} fit(s) x {steps} steps per kind, first {WARMUP}"
        f" steps left out; MLP {WIDTH}x{WIDTH}x{WIDTH}x{CLASSES}, batch {BATCH} per process, AdamW"
    )
    print_table(["kind", "ms/step (rank 0)", "final loss"], rows)
    device = summarize("loop hpu ÷ loop cpu", device_ratios, DEVICE_TARGET)
    lightning = summarize("trainer hpu ÷ loop hpu", lightning_ratios, LIGHTNING_TARGET)
    for first, second in (("loop hpu", "loop cpu"), ("trainer hpu", "loop hpu")):
        losses = [(a["loss"], b["loss"]) for a, b in zip(results[first], results[second])]
        equal = all(a == b for a, b in losses)
        gap = max(abs(a - b) for a, b in losses)
        print(f"final losses equal, {first} and {second}: {'yes' if equal else f'no (largest gap {gap:.2e})'}")

    if is_virtual():
        lazy = launch_pair(
            __file__, [",".join(LAZY_KINDS), "--repeats", "1", "--steps", str(steps)], PT_HPU_LAZY_MODE="1"
        )
        rows = []
        for kind, (result,) in lazy.items():
            counts = result["per_step"]
            cells = [f"{counts[key]:.2f}" for key in ("graphs", "graph_compilation", "host_syncs", "mark_steps")]
            rows.append([kind, *cells, spread(result["ms"]), f"{result['loss']:.6f}"])
        print(f"lazy mode (PT_HPU_LAZY_MODE=1), per step on rank 0, mean over {steps - WARMUP - 1} steps after warm-up")
        header = ["kind", "graphs/step", "graph compilations/step", "host syncs/step", "mark_steps/step"]
        print_table(header + ["ms/step", "final loss"], rows)
    else:
        print("lazy-mode graphs and host syncs are read from the virtual Gaudi's counters: run with VIRTUAL_HPU=1")
    print(f"fsdp_ratio_max={max(device.median, lightning.median):.3f}")


if __name__ == "__main__":
    main()
