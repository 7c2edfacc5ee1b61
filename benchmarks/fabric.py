"""Per-step time of a Lightning Fabric training loop on HPU against the same loop written by hand.

The Fabric loop is what a Fabric user writes (``fabric.setup``, ``fabric.backward``, ``optimizer.step()``); the
hand-written one is what a careful Gaudi user writes without Fabric (batches moved to the device, ``mark_step()`` after
backward and after ``optimizer.step()`` in lazy mode, nothing read back to the host). Both run the same ops in the same
order, so they end with the same loss and weights, bit for bit. The same comparison on the CPU is printed as a
reference: upstream Fabric's own per-step cost.

Timed in lockstep, because machines are noisy: the two loops take their steps alternately (Fabric first in even
repeats, the hand-written loop first in odd ones), so every Fabric step is paired with a hand-written step taken at
nearly the same moment; the cases' runs are interleaved (the order flips every repetition). Per case it prints
median [min, max] milliseconds per step after warm-up and whether the results match, and the ratio Fabric ÷ loop: the
median over runs of each run's median paired ratio, with min and max (target <= 1.05 on HPU, none for the CPU
reference). Last line ``fabric_ratio_max=<float>``, the largest median ratio on HPU.

    python benchmarks/fabric.py [--fast] [--repeats N] [--steps N]
"""

import copy
import statistics
import time
from argparse import ArgumentParser
from collections.abc import Callable
from contextlib import nullcontext

from _common import interleaved, print_table, seeded_mlp, spread, summarize, use_gaudi_or_virtual

use_gaudi_or_virtual()

import lightning as L  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

WIDTH, BATCH, CLASSES = 1024, 256, 10
# (accelerator, precision); the CPU case is upstream's reference
CASES = (("hpu", "32-true"), ("hpu", "bf16-mixed"), ("cpu", "32-true"))
WARMUP = 3
TARGET = 1.05


def _network() -> nn.Module:
    return seeded_mlp(WIDTH, CLASSES)


def _batches(steps: int) -> list:
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(BATCH, WIDTH, generator=generator), torch.randint(0, CLASSES, (BATCH,), generator=generator))
        for _ in range(steps)
    ]


def fabric_loop(device: str, precision: str, network: nn.Module) -> tuple:
    """(step, model, last loss): one step of the Fabric loop at each call of ``step(batch)``."""
    fabric = L.Fabric(accelerator=device, devices=1, precision=precision)
    optimizer = torch.optim.AdamW(network.parameters(), lr=1e-3)
    model, optimizer = fabric.setup(network, optimizer)
    losses: list = []

    def step(batch: tuple) -> None:
        inputs, targets = fabric.to_device(batch)
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        fabric.backward(loss)
        optimizer.step()
        losses.append(loss.detach())

    return step, model, losses


def hand_written_loop(device: str, precision: str, network: nn.Module) -> tuple:
    """The same loop without Fabric, as a careful Gaudi user writes it."""
    import habana_frameworks.torch.core as htcore

    mark_step = htcore.mark_step if device == "hpu" and htcore.is_lazy() else lambda: None
    model = network.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses: list = []

    def step(batch: tuple) -> None:
        inputs, targets = (tensor.to(device) for tensor in batch)
        autocast = torch.autocast(device, dtype=torch.bfloat16) if precision == "bf16-mixed" else nullcontext()
        with autocast:
            loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        mark_step()
        optimizer.step()
        mark_step()
        losses.append(loss.detach())

    return step, model, losses


def _timed(step: Callable[[tuple], None], batch: tuple, seconds: list) -> None:
    start = time.perf_counter()
    step(batch)
    seconds.append(time.perf_counter() - start)


def run(device: str, precision: str, steps: int, fabric_first: bool) -> dict:
    """Both loops in lockstep from the same weights; per-step seconds of each, and whether they ended equal."""
    network = _network()
    fabric_step, fabric_model, fabric_losses = fabric_loop(device, precision, network)
    loop_step, loop_model, loop_losses = hand_written_loop(device, precision, copy.deepcopy(_network()))
    fabric_seconds: list = []
    loop_seconds: list = []
    for batch in _batches(steps):
        if fabric_first:
            _timed(fabric_step, batch, fabric_seconds)
            _timed(loop_step, batch, loop_seconds)
        else:
            _timed(loop_step, batch, loop_seconds)
            _timed(fabric_step, batch, fabric_seconds)
    same = all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(fabric_model.parameters(), loop_model.parameters()))
    return {
        "fabric": fabric_seconds[WARMUP:],
        "loop": loop_seconds[WARMUP:],
        "losses": (fabric_losses[-1].cpu(), loop_losses[-1].cpu()),
        "same": same and torch.equal(fabric_losses[-1].cpu(), loop_losses[-1].cpu()),
    }


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="one short run per case (smoke test)")
    parser.add_argument("--repeats", type=int, default=6, help="runs per case")
    parser.add_argument("--steps", type=int, default=25, help="training steps per run")
    args = parser.parse_args()
    repeats, steps = (1, WARMUP + 3) if args.fast else (args.repeats, args.steps)

    results = interleaved(CASES, repeats, lambda case, repeat: run(*case, steps, fabric_first=repeat % 2 == 0))

    rows, ratios = [], {}
    for (device, precision), runs in results.items():
        ratios[device, precision] = [
            statistics.median(f / loop for f, loop in zip(r["fabric"], r["loop"])) for r in runs
        ]
        overheads = [statistics.median(1000 * (f - loop) for f, loop in zip(r["fabric"], r["loop"])) for r in runs]
        fabric_loss, loop_loss = runs[-1]["losses"]
        same = all(r["same"] for r in runs)
        equality = "bitwise" if same else f"no: {fabric_loss.item():.6g} vs {loop_loss.item():.6g}"
        rows.append(
            [
                device,
                precision,
                spread([s * 1000 for r in runs for s in r["loop"]]),
                spread([s * 1000 for r in runs for s in r["fabric"]]),
                spread(overheads),
                equality,
            ]
        )
    print(
        f"{repeats} run(s) x {steps} steps per case, first {WARMUP} steps of each run left out;"
        f" MLP {WIDTH}x{WIDTH}x{WIDTH}x{CLASSES}, batch {BATCH}, AdamW"
    )
    header = ["device", "precision", "loop ms/step", "Fabric ms/step", "overhead ms (per run)", "same result"]
    print_table(header, rows)
    on_hpu = []
    for (device, precision), samples in ratios.items():
        ratio = summarize(f"{device} {precision}: Fabric ÷ loop", samples, TARGET if device == "hpu" else None)
        if device == "hpu":
            on_hpu.append(ratio.median)
    print(f"fabric_ratio_max={max(on_hpu):.3f}")


if __name__ == "__main__":
    main()
