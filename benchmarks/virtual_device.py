"""Training-step time on the virtual Gaudi against the same step on the CPU, in one run.

Each case builds one model per device from the same seed; in each repetition the devices take turns step by step (the
order flipping every turn), so machine noise hits both sides alike, and each device's median step counts. Per case it
prints median [min, max] milliseconds per step and the hpu ÷ cpu ratio, the median over repetitions of each
repetition's ratio with min and max (target <= 1.05: the virtual device runs the host's kernels, so it should cost no
more than the CPU); last line ``ratio_max=<float>``, the largest median ratio.

    python benchmarks/virtual_device.py [--fast] [--repeats N] [--steps N]
"""

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from _common import interleaved, print_table, spread, summarize, use_gaudi_or_virtual

use_gaudi_or_virtual()

import torch  # noqa: E402
from torch import nn  # noqa: E402


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
TARGET = 1.05


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


def _compare(case: Case, repeats: int, steps: int, warmup: int) -> dict:
    """Milliseconds per step of ``case`` on each device, one value per repetition: the median of ``steps`` steps, the
    devices taking turns step by step, so that a slow moment of the machine falls on a step or two of either."""
    trainers = {"cpu": _trainer(case, "cpu"), "hpu": _trainer(case, "hpu")}
    for step in trainers.values():
        _time(step, warmup)
    times: dict = {device: [] for device in trainers}
    for _ in range(repeats):
        turns = interleaved(list(trainers), steps, lambda device, _: _time(trainers[device], 1))
        for device, ms in turns.items():
            times[device].append(statistics.median(ms))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fast", action="store_true", help="one repeat of one step per device (smoke test)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--steps", type=int, default=6, help="steps per device and repetition")
    args = parser.parse_args()
    repeats, steps, warmup = (1, 1, 1) if args.fast else (args.repeats, args.steps, 3)

    import habana_frameworks.torch.core  # noqa: F401  (activates the device in lazy mode too)

    rows, lines = [], []
    for case in CASES:
        times = _compare(case, repeats, steps, warmup)
        rows.append([case.name, spread(times["cpu"], 3), spread(times["hpu"], 3)])
        lines.append((case.name, [hpu / cpu for hpu, cpu in zip(times["hpu"], times["cpu"])]))
    print(
        f"milliseconds per training step, median [min, max] over {repeats} repetition(s), each the median of {steps}"
        " step(s) per device, the devices taking turns"
    )
    print_table(["case", "cpu ms/step", "hpu ms/step"], rows)
    medians = [summarize(f"{name}: hpu ÷ cpu", ratios, TARGET).median for name, ratios in lines]
    print(f"ratio_max={max(medians):.3f}")


if __name__ == "__main__":
    main()
