"""DeepSpeed ZeRO-2 in bf16 on 2 processes: the HPU against the CPU, and the Trainer against a hand-written loop.

Every fit trains the same MLP with AdamW from the same seed on the same rows (each rank its own half of every global
batch), with:

- ``loop hpu``: the loop a DeepSpeed user writes (``deepspeed.initialize``, ``engine.backward``, ``engine.step``) on
  the HPU over HCCL, with DeepSpeed's HPU accelerator;
- ``loop cpu``: the same loop on the CPU over gloo, with DeepSpeed's CPU accelerator;
- ``trainer hpu``: ``pl.Trainer(accelerator="hpu", devices=2, strategy="hpu_deepspeed_stage_2",
  precision="bf16-mixed")``, with the HPU loop in lockstep (an engine of its own, on the Trainer's process group).

The Trainer is timed in lockstep with the loop, because machines are noisy and a 2-process step waits for the slower
rank: a callback takes one step of the loop inside every Trainer step (at its start in even repetitions, at its end in
odd ones), so every Trainer step is paired with a loop step taken at nearly the same moment. A Trainer step is the time
between the starts of two consecutive training steps minus the loop step inside it. The loops on the two devices run
on their own, a fit each (DeepSpeed has one accelerator per process). This script starts the two processes itself (as
``torchrun`` would; Lightning joins them), and each runs every kind of fit in turn, the order swapping every
repetition, each fit with its own process group.

Per kind it prints median [min, max] milliseconds per step on rank 0 after warm-up and the final loss and weights, and
two ratios, each the median over repetitions with min and max: ``loop hpu ÷ loop cpu``, the ratio of the median steps
of a repetition's two loop fits, what the device costs DeepSpeed (target <= 1.05 on the virtual Gaudi, where both run
the host's kernels); and ``trainer hpu ÷ loop hpu``, a fit's median of its paired step ratios, what Lightning adds
(target <= 1.05 at >= 20 ms per step, what the model is sized for: the Trainer's hooks cost the same fixed time per
step however long it is, about 1 ms here). The loops on both devices, the Trainer and the loop in lockstep with it end
with the same loss and weights, bit for bit. Last line ``deepspeed_ratio_max=<float>``, the larger of the two median
ratios.

    python benchmarks/deepspeed.py [--fast] [--repeats N] [--steps N]
"""

import json
import os
import time
import warnings
from argparse import SUPPRESS, ArgumentParser
from typing import Any

from _common import (
    QUIET_TRAINER,
    classifier,
    fit_groups,
    interleaved,
    launch_pair,
    lockstep,
    paired_ratio,
    print_table,
    rank_rows,
    spread,
    step_ratios,
    summarize,
    use_gaudi_or_virtual,
    weights_digest,
)

use_gaudi_or_virtual()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import pytorch_lightning as pl  # noqa: E402

WIDTH, BATCH, CLASSES, RANKS = 1024, 128, 10, 2
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


def use_accelerator(device: str) -> None:
    """DeepSpeed places its buffers and picks its collective backend by its one global accelerator."""
    from deepspeed.accelerator import get_accelerator, set_accelerator

    if get_accelerator().device_name() != device:
        if device == "hpu":
            from deepspeed.accelerator.hpu_accelerator import HPU_Accelerator as Accelerator
        else:
            from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator as Accelerator
        set_accelerator(Accelerator())


class DeepSpeedLoop:
    """The loop a DeepSpeed user writes, one step at each call of ``step()``, on the default process group."""

    def __init__(self, device: str, rank: int, steps: int) -> None:
        import deepspeed

        use_accelerator(device)
        model = network()
        config = {
            "train_micro_batch_size_per_gpu": BATCH,
            "gradient_accumulation_steps": 1,
            "bf16": {"enabled": True},
            "zero_optimization": ZERO_2,
            "zero_allow_untested_optimizer": True,
        }
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.device = torch.device(device, rank) if device == "hpu" else torch.device("cpu")
        initialized = deepspeed.initialize(model=model, optimizer=optimizer, config=config, dist_init_required=False)
        self.engine = initialized[0]
        self.batches = iter(DataLoader(rank_rows(steps, rank, BATCH, WIDTH, CLASSES, RANKS), batch_size=BATCH))
        self.loss: Any = None

    def step(self) -> None:
        inputs, targets = next(self.batches)
        inputs, targets = inputs.to(self.device, torch.bfloat16), targets.to(self.device)
        loss = nn.functional.cross_entropy(self.engine(inputs), targets)
        self.engine.backward(loss)
        self.engine.step()
        self.loss = loss.detach()

    def close(self) -> list:
        """[final loss, weights' fingerprint]."""
        return [self.loss.float().item(), weights_digest(self.engine.module)]


def loop(device: str, steps: int, rank: int) -> dict:
    """``steps`` steps of the loop on its own on ``device``; this rank's step times, final loss and weights."""
    import deepspeed

    use_accelerator(device)
    if device == "hpu":
        import habana_frameworks.torch.distributed.hccl  # noqa: F401  (registers the backend)
    deepspeed.init_distributed(dist_backend="hccl" if device == "hpu" else "gloo")
    hand_written, seconds = DeepSpeedLoop(device, rank, steps), []
    for _ in range(steps):
        start = time.perf_counter()
        hand_written.step()
        seconds.append(time.perf_counter() - start)
    result = {"ms": [s * 1000 for s in seconds[WARMUP:]], "end": hand_written.close()}
    deepspeed.comm.destroy_process_group()
    return result


def fit(steps: int, rank: int, loop_at_end: bool) -> dict:
    """The same training with ``pl.Trainer`` and ``strategy="hpu_deepspeed_stage_2"``, the HPU loop in lockstep; this
    rank's paired step times, and the final loss and weights of each."""
    import deepspeed

    model = classifier(pl.LightningModule, network)
    paced = lockstep(lambda: DeepSpeedLoop("hpu", rank, steps), loop_at_end)
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=RANKS,
        strategy="hpu_deepspeed_stage_2",
        precision="bf16-mixed",
        max_steps=steps,
        use_distributed_sampler=False,  # each rank already has its own rows, as in the loop
        callbacks=[paced],
        **QUIET_TRAINER,
    )
    trainer.fit(model, DataLoader(rank_rows(steps, rank, BATCH, WIDTH, CLASSES, RANKS), batch_size=BATCH))
    deepspeed.comm.destroy_process_group()  # the next fit, possibly of another kind, starts its own group
    return {
        **paced.ms(WARMUP),
        "end": [model.last_loss.float().item(), weights_digest(model)],
        "loop end": paced.closed,
    }


def worker(repeats: int, steps: int) -> None:
    """One of the two processes: every kind ``repeats`` times; rank 0 prints the results as one JSON line."""
    rank, next_fit = int(os.environ["LOCAL_RANK"]), fit_groups()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")

    def measure(kind: str, repeat: int) -> dict:
        next_fit()
        if kind == "trainer hpu":
            return fit(steps, rank, loop_at_end=repeat % 2 == 1)
        return loop(kind.split()[1], steps, rank)

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
    trainer_fits = results["trainer hpu"]
    # (kind, fits, key of its step times, key of its final loss and weights)
    kinds = [
        ("loop hpu", results["loop hpu"], "ms", "end"),
        ("loop cpu", results["loop cpu"], "ms", "end"),
        ("trainer hpu", trainer_fits, "trainer", "end"),
        ("loop hpu, in lockstep", trainer_fits, "loop", "loop end"),
    ]
    rows = []
    for kind, fits, times, end in kinds:
        loss, weights = fits[-1][end]
        rows.append([kind, spread([value for result in fits for value in result[times]]), f"{loss:.6f}", weights])
    print(
        f"{RANKS} processes, ZeRO stage 2, bf16, {repeats} fit(s) x {steps} steps per kind, the Trainer with the HPU"
        f" loop in lockstep, first {WARMUP} steps of each fit left out; MLP {WIDTH}x{WIDTH}x{WIDTH}x{CLASSES}, batch"
        f" {BATCH} per process, AdamW"
    )
    print_table(["kind", "ms/step (rank 0)", "final loss", "weights (sha1)"], rows)
    device = summarize("loop hpu ÷ loop cpu", step_ratios(results, "loop hpu", "loop cpu"), DEVICE_TARGET)
    lightning = summarize("trainer hpu ÷ loop hpu", [paired_ratio(fit) for fit in trainer_fits], LIGHTNING_TARGET)
    ends = {kind: [fit[end] for fit in fits] for kind, fits, _, end in kinds}
    same_device = ends["loop hpu"] == ends["loop cpu"]
    same_lightning = ends["trainer hpu"] == ends["loop hpu, in lockstep"] == ends["loop hpu"]
    print(f"final losses and weights bitwise equal, loop hpu and loop cpu: {_yes(same_device)}")
    print(f"final losses and weights bitwise equal, trainer hpu and loop hpu: {_yes(same_lightning)}")
    print(f"deepspeed_ratio_max={max(device.median, lightning.median):.3f}")


if __name__ == "__main__":
    main()
