"""Per-step time of ``pl.Trainer(accelerator="hpu", devices=1)`` against a hand-written Gaudi training loop.

The idea is upstream Lightning's parity benchmark (Trainer against plain PyTorch): the same model, data, optimizer and
seed, trained by the Trainer and by the loop a careful Gaudi user writes (batches moved to the device, ``mark_step()``
after backward and after ``optimizer.step()``, nothing read back to the host during training). Both run the same ops
in the same order, so they must end with the same loss and weights, bit for bit.

The same comparison on the CPU (``accelerator="cpu"`` against the same loop without graph cuts), in each precision, is
printed as a reference: it is upstream Lightning's own per-step cost, which the HPU integration should not add to.

Timed in lockstep, because machines are noisy: while the Trainer trains, a callback takes one step of the hand-written
loop at every training step (at its start in even repeats, at its end in odd ones), so every Trainer step is paired
with a loop step taken at nearly the same moment. A Trainer step is the time between the starts of two consecutive
training steps minus the loop step inside it. The cases' fits are interleaved (the order flips every repetition).
Per case it prints median [min, max] milliseconds per step after warm-up, what ``fit()`` costs before its first step,
and whether the results match. The ratios, each the median over fits of one value per fit, with min and max:
Trainer ÷ loop per case (the fit's median of its paired step ratios; target <= 1.03 on HPU, none for the CPU
reference), and the HPU's overhead minus the CPU's in the same precision, in milliseconds per step (the fit's median
Trainer step minus loop step, against the CPU fit of the same repetition; target <= 0.3 ms). Last line
``overhead_ratio_max=<float>``, the largest median ratio on HPU.

    python benchmarks/trainer_overhead.py [--fast] [--repeats N] [--steps N]
"""

import copy
import statistics
import time
import warnings
from argparse import ArgumentParser
from collections.abc import Iterator
from contextlib import nullcontext

from _common import QUIET_TRAINER, interleaved, print_table, seeded_mlp, spread, summarize, use_gaudi_or_virtual

use_gaudi_or_virtual()

import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pytorch_lightning as pl  # noqa: E402

WIDTH, BATCH, CLASSES = 1024, 256, 10
PRECISIONS = ("32-true", "bf16-mixed")
# (accelerator, precision); the CPU cases are upstream's reference
CASES = tuple((device, precision) for device in ("hpu", "cpu") for precision in PRECISIONS)
WARMUP = 3
RATIO_TARGET, EXTRA_MS_TARGET = 1.03, 0.3


def _network() -> nn.Module:
    return seeded_mlp(WIDTH, CLASSES)


def _optimizer(parameters: Iterator[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(parameters, lr=1e-3)


def _data(steps: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(steps * BATCH, WIDTH, generator=generator)
    return TensorDataset(inputs, torch.randint(0, CLASSES, (steps * BATCH,), generator=generator))


class HandWrittenLoop:
    """The loop a careful Gaudi user writes, taken one step at a time."""

    def __init__(self, network: nn.Module, data: TensorDataset, device: str, precision: str) -> None:
        import habana_frameworks.torch.core as htcore

        self.mark_step = htcore.mark_step if device == "hpu" else lambda: None
        self.device = device
        self.model = network.to(device)
        self.optimizer = _optimizer(self.model.parameters())
        self.batches = iter(DataLoader(data, batch_size=BATCH))
        self.precision = precision
        self.last_loss = None

    def step(self) -> None:
        inputs, targets = (tensor.to(self.device) for tensor in next(self.batches))
        bf16 = self.precision == "bf16-mixed"
        autocast = torch.autocast(self.device, dtype=torch.bfloat16) if bf16 else nullcontext()
        with autocast:
            loss = nn.functional.cross_entropy(self.model(inputs), targets)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.mark_step()
        self.optimizer.step()
        self.mark_step()
        self.last_loss = loss.detach()


class Classifier(pl.LightningModule):
    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network
        self.last_loss = None

    def training_step(self, batch: tuple, batch_idx: int) -> Tensor:
        inputs, targets = batch
        loss = nn.functional.cross_entropy(self.network(inputs), targets)
        self.last_loss = loss.detach()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return _optimizer(self.parameters())


class Lockstep(pl.Callback):
    """Takes a step of the hand-written loop inside every Trainer step, and times both."""

    def __init__(self, loop: HandWrittenLoop, loop_at_end: bool) -> None:
        self.loop, self.loop_at_end = loop, loop_at_end
        self.step_starts: list = []
        self.loop_seconds: list = []

    def _loop_step(self) -> None:
        start = time.perf_counter()
        self.loop.step()
        self.loop_seconds.append(time.perf_counter() - start)

    def on_train_batch_start(self, trainer: pl.Trainer, *args: object) -> None:
        self.step_starts.append(time.perf_counter())
        if not self.loop_at_end:
            self._loop_step()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if self.loop_at_end:
            self._loop_step()


def run(device: str, precision: str, steps: int, loop_at_end: bool) -> dict:
    """Train once with the Trainer and the loop in lockstep; per-step seconds of each, and the final results."""
    network, data = _network(), _data(steps)
    loop = HandWrittenLoop(copy.deepcopy(network), data, device, precision)
    model, lockstep = Classifier(network), Lockstep(loop, loop_at_end)
    trainer = pl.Trainer(
        accelerator=device,
        devices=1,
        precision=precision,
        max_steps=steps,
        callbacks=[lockstep],
        **QUIET_TRAINER,
    )
    start = time.perf_counter()
    trainer.fit(model, DataLoader(data, batch_size=BATCH))
    starts, loop_seconds = lockstep.step_starts, lockstep.loop_seconds
    trainer_seconds = [later - earlier - inside for earlier, later, inside in zip(starts, starts[1:], loop_seconds)]
    same_weights = all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(model.parameters(), loop.model.parameters()))
    return {
        "trainer": trainer_seconds[WARMUP:],
        "loop": loop_seconds[WARMUP : len(trainer_seconds)],
        "setup": starts[0] - start,
        "losses": (model.last_loss.cpu(), loop.last_loss.cpu()),
        "same": same_weights and torch.equal(model.last_loss.cpu(), loop.last_loss.cpu()),
    }


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="one short run per case (smoke test)")
    parser.add_argument("--repeats", type=int, default=12, help="fits per case")
    parser.add_argument("--steps", type=int, default=25, help="training steps per fit")
    args = parser.parse_args()
    repeats, steps = (1, WARMUP + 3) if args.fast else (args.repeats, args.steps)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")

    results = interleaved(CASES, repeats, lambda case, repeat: run(*case, steps, loop_at_end=repeat % 2 == 1))

    rows, ratios, overheads = [], {}, {}
    for (device, precision), runs in results.items():
        # per fit: the median of its paired step ratios, and of its paired step differences in milliseconds
        ratios[device, precision] = [
            statistics.median(t / loop for t, loop in zip(r["trainer"], r["loop"])) for r in runs
        ]
        overheads[device, precision] = [
            statistics.median(1000 * (t - loop) for t, loop in zip(r["trainer"], r["loop"])) for r in runs
        ]
        same = all(r["same"] for r in runs)
        trainer_loss, loop_loss = runs[-1]["losses"]
        equality = "bitwise" if same else f"no: {trainer_loss.item():.6g} vs {loop_loss.item():.6g}"
        rows.append(
            [
                device,
                precision,
                spread([s * 1000 for r in runs for s in r["loop"]]),
                spread([s * 1000 for r in runs for s in r["trainer"]]),
                spread(overheads[device, precision]),
                spread([r["setup"] * 1000 for r in runs], 0),
                equality,
            ]
        )
    print(
        f"{repeats} fit(s) x {steps} steps per case, first {WARMUP} steps of each fit left out;"
        f" MLP {WIDTH}x{WIDTH}x{WIDTH}x{CLASSES}, batch {BATCH}, AdamW"
    )
    header = ["device", "precision", "loop ms/step", "Trainer ms/step", "overhead ms (per fit)"]
    print_table(header + ["fit() to 1st step ms", "final loss & weights equal"], rows)
    on_hpu = []
    for (device, precision), samples in ratios.items():
        target = RATIO_TARGET if device == "hpu" else None  # the CPU is upstream's own cost: the reference
        ratio = summarize(f"{device} {precision}: Trainer ÷ loop", samples, target)
        if device == "hpu":
            on_hpu.append(ratio.median)
    for precision in PRECISIONS:
        extra = [hpu - cpu for hpu, cpu in zip(overheads["hpu", precision], overheads["cpu", precision])]
        summarize(f"hpu {precision}: Trainer overhead − CPU's, ms", extra, EXTRA_MS_TARGET)
    print(f"overhead_ratio_max={max(on_hpu):.3f}")


if __name__ == "__main__":
    main()
