"""Training-step time on the virtual Gaudi against the same step on the CPU, in one run.

Each case builds one model per device from the same seed and times both devices in interleaved repeats (the order
alternates between repeats), so machine noise hits both sides alike. Prints median/min/max milliseconds per step,
the hpu/cpu ratio of medians per case and, as the last line, ``ratio_max=<float>``.

    PYTHONPATH=src python benchmarks/virtual_device.py [--fast] [--repeats N] [--steps N]
"""

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

# This script is named like the package it measures: keep its own directory off the import path, and use the
# repository's sources when the package is not installed.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.append(str(_HERE.parent / "src"))
import virtual_hpu  # noqa: E402


@dataclass
class Case:
    name: str
    make_model: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer]


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 10),
    )


CASES = [
    Case("mlp_sgd", _mlp, (784,), lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)),
    Case("mlp_adamw", _mlp, (784,), lambda p: torch.optim.AdamW(p, lr=1e-3)),
    Case("cnn_sgd", _cnn, (1, 28, 28), lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)),
]
BATCH = 256


def _trainer(case: Case, device: str) -> Callable[[], None]:
    """One training step of ``case`` on ``device``, cutting lazy graphs where a Gaudi loop would."""
    import habana_frameworks.torch.core as htcore

    torch.manual_seed(0)
    model = case.make_model().to(device)
    optimizer = case.make_optimizer(list(model.parameters()))
    x = torch.randn(BATCH, *case.input_shape).to(device)
    y = torch.randint(0, 10, (BATCH,)).to(device)
    on_hpu = device.startswith("hpu")

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        if on_hpu:
            htcore.mark_step()
        optimizer.step()
        if on_hpu:
            htcore.mark_step()

    return step


def _time(step: Callable[[], None], steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fast", action="store_true", help="one repeat of one step per device (smoke test)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--steps", type=int, default=5, help="steps per timed repeat")
    args = parser.parse_args()
    repeats, steps, warmup = (1, 1, 1) if args.fast else (args.repeats, args.steps, 3)

    virtual_hpu.activate()
    print(f"{'case':<10} {'device':<6} {'median ms':>10} {'min ms':>8} {'max ms':>8}")
    ratios = {}
    for case in CASES:
        trainers = {"cpu": _trainer(case, "cpu"), "hpu": _trainer(case, "hpu")}
        for step in trainers.values():
            _time(step, warmup)
        times: dict[str, list[float]] = {"cpu": [], "hpu": []}
        for repeat in range(repeats):
            order = ("cpu", "hpu") if repeat % 2 == 0 else ("hpu", "cpu")
            for device in order:
                times[device].append(_time(trainers[device], steps))
        for device, samples in times.items():
            print(
                f"{case.name:<10} {device:<6} {statistics.median(samples):>10.3f} {min(samples):>8.3f}"
                f" {max(samples):>8.3f}"
            )
        ratios[case.name] = statistics.median(times["hpu"]) / statistics.median(times["cpu"])
        print(f"{case.name:<10} ratio hpu/cpu = {ratios[case.name]:.3f}")
    print(f"ratio_max={max(ratios.values()):.3f}")


if __name__ == "__main__":
    main()
