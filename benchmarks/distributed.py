"""2-process data-parallel training: the Trainer's ``hpu_parallel`` step against a hand-written DDP loop without any
per-step check, and the HPU against the CPU.

Each fit trains the same MLP with AdamW from the same seed on the same rows (each rank its own half of every global
batch) twice at once, in lockstep:

- with ``pl.Trainer(devices=2)``: ``accelerator="hpu", strategy="hpu_parallel"`` over HCCL, or on the CPU
  ``strategy="ddp"`` over gloo (upstream's own cost, the reference);
- with the loop a DDP user writes (``DistributedDataParallel(model)``, ``loss.backward()``, ``optimizer.step()``,
  ``mark_step()`` after each in lazy mode) on the same device, over a process group of its own, with no per-step check
  of any kind (the Trainer agrees across ranks on ``SIGTERM`` every few steps, without waiting).

The Trainer's per-step SIGTERM check is timed too, call by call (its training epoch loop swapped for one of the same
class that times the check): on the HPU our asynchronous agreement (launching an exchange every few steps, collecting
it later), on the CPU upstream's blocking broadcast at every step. Its direct cost; the exchange itself runs on gloo's
thread meanwhile.

Timed in lockstep, because machines are noisy and a 2-process step waits for the slower rank: a callback takes one step
of the loop inside every Trainer step (at its start in even repetitions, at its end in odd ones), so every Trainer step
is paired with a loop step taken at nearly the same moment. A Trainer step is the time between the starts of two
consecutive training steps minus the loop step inside it. This script starts the two processes itself (as
``torchrun`` would; Lightning joins them); the HPU and CPU fits alternate, the order flipping every repetition, each fit
with its own process group. It runs in lazy mode, where graph cuts exist, unless ``PT_HPU_LAZY_MODE`` says otherwise.

Per device it prints median [min, max] milliseconds per step on rank 0 after warm-up, the final losses and, on the
virtual Gaudi, rank 0's host syncs and graphs per steady-state HPU step of each (targets: 0 and 2, as on one device).
Ratios, each the median over fits of one value per fit, with min and max: Trainer ÷ loop (the fit's median of its
paired step ratios; target <= 1.03 on HPU, none for the CPU reference), Trainer ÷ Trainer without the check (the fit's
median Trainer step over the same less the check's mean time per step; target <= 1.03 on HPU, none for the CPU), and
loop hpu ÷ loop cpu (the ratio of the median loop steps of a repetition's two fits; target <= 1.05 on the virtual Gaudi,
where both run the host's kernels). The Trainer and the loop must end with the same loss, bit for bit, on both devices.
Last line ``ddp_ratio_max=<float>``, the largest median of the HPU's ratios.

    python benchmarks/distributed.py [--fast] [--repeats N] [--steps N]
"""

import json
import os
import statistics
import time
import warnings
from argparse import SUPPRESS, ArgumentParser
from typing import Any, Callable

from _common import (
    QUIET_TRAINER,
    classifier,
    fit_groups,
    interleaved,
    is_virtual,
    launch_pair,
    lockstep,
    paired_ratio,
    print_table,
    rank_rows,
    seeded_mlp,
    spread,
    summarize,
    use_gaudi_or_virtual,
)

use_gaudi_or_virtual()
# the per-step graphs the strategy cuts exist in lazy mode only, the legacy mode, which has to be asked for
os.environ.setdefault("PT_HPU_LAZY_MODE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import pytorch_lightning as pl  # noqa: E402

WIDTH, BATCH, CLASSES, RANKS = 512, 128, 10, 2
WARMUP = 3
DEVICES = ("hpu", "cpu")
STRATEGIES = {"hpu": "hpu_parallel", "cpu": "ddp"}
LIGHTNING_TARGET, DEVICE_TARGET = 1.03, 1.05
COUNTED = ("host_syncs", "graphs")


def counters(device: str) -> dict:
    """The virtual Gaudi's counts of host syncs and graphs so far; none on the CPU or a real Gaudi."""
    if device != "hpu" or not is_virtual():
        return {}
    from virtual_hpu import accounting

    return {key: value for key, value in accounting.counters().items() if key in COUNTED}


class DDPLoop:
    """The loop a DDP user writes, one step at each call of ``step()``, on a process group of its own."""

    def __init__(self, device: str, rank: int, steps: int) -> None:
        self.cut: Callable[[], None] = _no_cut
        if device == "hpu":
            import habana_frameworks.torch.core as htcore

            self.cut = htcore.mark_step if htcore.is_lazy() else _no_cut
        self.device = torch.device("hpu", rank) if device == "hpu" else torch.device("cpu")
        self.group = dist.new_group(backend="hccl" if device == "hpu" else "gloo")
        self.model = nn.parallel.DistributedDataParallel(
            seeded_mlp(WIDTH, CLASSES).to(self.device), process_group=self.group
        )
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.batches = iter(DataLoader(rank_rows(steps, rank, BATCH, WIDTH, CLASSES, RANKS), batch_size=BATCH))
        self.loss: Any = None

    def step(self) -> None:
        inputs, targets = (tensor.to(self.device) for tensor in next(self.batches))
        loss = nn.functional.cross_entropy(self.model(inputs), targets)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.cut()
        self.optimizer.step()
        self.cut()
        self.loss = loss.detach()

    def close(self) -> float:
        """The final loss; the loop's process group is destroyed."""
        loss = self.loss.cpu().item()
        # the DDP module goes before its process group: freed after the group is destroyed, it leaves a rank hanging now
        # and then (plain DDP over gloo on CPU tensors too)
        del self.model, self.optimizer
        dist.destroy_process_group(self.group)
        return loss


def time_sigterm_check(trainer: pl.Trainer) -> list:
    """Swaps the Trainer's training epoch loop for one of the same class whose per-step SIGTERM check is timed; the
    list returned gets the seconds of each call."""
    seconds: list = []
    loop = trainer.fit_loop.epoch_loop

    class _TimedCheck(type(loop)):  # type: ignore[misc]
        def _broadcast_sigterm_tensor(self) -> None:
            start = time.perf_counter()
            super()._broadcast_sigterm_tensor()
            seconds.append(time.perf_counter() - start)

    trainer.fit_loop.epoch_loop = _TimedCheck(trainer, min_steps=loop.min_steps, max_steps=loop.max_steps)
    return seconds


def fit(device: str, steps: int, rank: int, loop_at_end: bool) -> dict:
    """One fit of the Trainer with the loop in lockstep; this rank's paired step times, counts and final losses."""
    model = classifier(pl.LightningModule, lambda: seeded_mlp(WIDTH, CLASSES))
    paced = lockstep(lambda: DDPLoop(device, rank, steps), loop_at_end, lambda: counters(device))
    trainer = pl.Trainer(
        accelerator=device,
        devices=RANKS,
        strategy=STRATEGIES[device],
        max_steps=steps,
        use_distributed_sampler=False,  # each rank already has its own rows, as in the loop
        callbacks=[paced],
        **QUIET_TRAINER,
    )
    check_seconds = time_sigterm_check(trainer)
    trainer.fit(model, DataLoader(rank_rows(steps, rank, BATCH, WIDTH, CLASSES, RANKS), batch_size=BATCH))
    backend = dist.get_backend()
    dist.destroy_process_group()  # the next fit, possibly on the other device, starts its own group
    result = {**paced.ms(WARMUP), "backend": backend, "losses": [model.last_loss.cpu().item(), paced.closed]}
    result["check"] = [1000 * seconds for seconds in check_seconds[WARMUP:]]
    per_step = paced.per_step(WARMUP)
    if per_step is not None:
        result["per_step"] = per_step
    return result


def worker(repeats: int, steps: int) -> None:
    """One of the two processes: a fit on each device ``repeats`` times; rank 0 prints the results as one JSON line."""
    rank, next_fit = int(os.environ["LOCAL_RANK"]), fit_groups()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")

    def measure(device: str, repeat: int) -> dict:
        next_fit()
        return fit(device, steps, rank, loop_at_end=repeat % 2 == 1)

    results = interleaved(DEVICES, repeats, measure)
    if rank == 0:
        print(json.dumps(results))


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="one short fit on each device (smoke test)")
    parser.add_argument("--repeats", type=int, default=8, help="fits on each device")
    parser.add_argument("--steps", type=int, default=25, help="training steps per fit")
    parser.add_argument("--worker", action="store_true", help=SUPPRESS)
    args = parser.parse_args()
    repeats, steps = (1, WARMUP + 4) if args.fast else (args.repeats, args.steps)
    if args.worker:
        worker(repeats, steps)
        return

    results = launch_pair(__file__, ["--repeats", str(repeats), "--steps", str(steps)])
    rows = []
    for device, fits in results.items():
        for kind in ("trainer", "loop"):
            counts = fits[-1].get("per_step", {}).get(kind)
            cells = [f"{counts[key]:.2f}" for key in COUNTED] if counts else ["-", "-"]
            strategy = STRATEGIES[device] if kind == "trainer" else "DistributedDataParallel"
            ms = spread([value for result in fits for value in result[kind]])
            loss = fits[-1]["losses"][kind == "loop"]
            check = spread([statistics.mean(result["check"]) for result in fits], 3) if kind == "trainer" else "-"
            rows.append([f"{kind} {device}", strategy, fits[0]["backend"], ms, check, *cells, f"{loss:.6f}"])
    mode = "lazy" if os.environ["PT_HPU_LAZY_MODE"] == "1" else "eager"
    print(
        f"{RANKS} processes, {mode} mode on HPU, {repeats} fit(s) x {steps} steps per device, the Trainer and the loop"
        f" in lockstep, first {WARMUP} steps of each fit left out; MLP {WIDTH}x{WIDTH}x{WIDTH}x{CLASSES}, batch"
        f" {BATCH} per process, AdamW"
    )
    header = ["kind", "strategy", "backend", "ms/step (rank 0)", "SIGTERM check ms/step (mean per fit)"]
    header += ["host syncs/step", "graphs/step", "final loss"]
    print_table(header, rows)
    hpu_ratios = []
    for device, fits in results.items():
        paired = [paired_ratio(fit) for fit in fits]
        target = LIGHTNING_TARGET if device == "hpu" else None  # the CPU is upstream's own cost: the reference
        name = f"{device}: {STRATEGIES[device]} Trainer"
        unchecked = [_without_check(fit) for fit in fits]
        ratios = [
            summarize(f"{name} ÷ DDP loop", paired, target),
            summarize(f"{name} ÷ the same without its SIGTERM check", unchecked, target),
        ]
        if device == "hpu":
            hpu_ratios.extend(ratio.median for ratio in ratios)
    pairs = zip(results["hpu"], results["cpu"])
    per_device = [statistics.median(hpu["loop"]) / statistics.median(cpu["loop"]) for hpu, cpu in pairs]
    hpu_ratios.append(summarize("DDP loop hpu ÷ DDP loop cpu", per_device, DEVICE_TARGET).median)
    losses = [fit["losses"] for fits in results.values() for fit in fits]
    print(f"final losses bitwise equal, Trainer and loop on each device: {_yes(all(a == b for a, b in losses))}")
    same = all(h["losses"] == c["losses"] for h, c in zip(results["hpu"], results["cpu"]))
    print(f"final losses bitwise equal, hpu and cpu: {_yes(same)}")
    print(f"ddp_ratio_max={max(hpu_ratios):.3f}")


def _without_check(fit: dict) -> float:
    """The fit's median Trainer step over the same less the mean time its SIGTERM check took per step."""
    step = statistics.median(fit["trainer"])
    return step / (step - statistics.mean(fit["check"]))


def _no_cut() -> None:
    """Graphs are cut in lazy mode only."""


def _yes(condition: bool) -> str:
    return "yes" if condition else "no"


if __name__ == "__main__":
    main()
