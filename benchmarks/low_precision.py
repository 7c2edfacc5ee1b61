"""Mixed-precision training steps against fp32 ones, on the virtual Gaudi and on the CPU, in one run.

A host CPU without bf16 (or float16) matrix instructions computes torch's low-precision matmuls about a hundred times
slower than fp32 ones; the virtual Gaudi then computes them in fp32 and rounds once, as Gaudi's matrix engine
accumulates. This shows what that gives per step: a ``Linear``/``GELU``/``LayerNorm`` MLP trained with AdamW in fp32 and
under ``torch.autocast`` in bf16 and float16, on ``hpu`` and on ``cpu``, every case timed in each of interleaved
repetitions. Prints milliseconds per step (median [min, max]) and the ratios, each the median over repetitions of that
repetition's ratio: HPU ÷ CPU per precision, and low precision ÷ fp32 per device. Only HPU ÷ CPU in fp32 and bf16 has
a target; where the host has no float16 units, float16 on the CPU is the slow path this avoids. Last line
``low_precision_ratio_max=<float>``, the larger of the two judged medians.

    python benchmarks/low_precision.py [--fast] [--repeats N]
"""

import argparse
import time
from collections.abc import Callable
from typing import Optional

from _common import interleaved, print_table, spread, summarize, use_gaudi_or_virtual

use_gaudi_or_virtual()

import torch  # noqa: E402
from torch import nn  # noqa: E402

PRECISIONS: dict[str, Optional[torch.dtype]] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
DEVICES = ("cpu", "hpu")
TARGET = 1.05  # HPU ÷ CPU, where both compute the same way


def _stepper(device: str, dtype: Optional[torch.dtype], width: int) -> Callable[[], None]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.LayerNorm(2 * width), nn.Linear(2 * width, 10)).to(
        device
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs, targets = torch.randn(128, width).to(device), torch.randint(0, 10, (128,)).to(device)

    def step() -> None:
        with torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "hpu":
            loss.item()  # the device is synchronous; this keeps the two sides doing the same work

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="a small model and few repetitions (smoke test)")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.fast else 7)
    width, steps = (64, 2) if args.fast else (512, 5)
    print(
        "host low-precision matrix instructions: "
        f"bf16={torch.ops.mkldnn._is_mkldnn_bf16_supported()}, fp16={torch.ops.mkldnn._is_mkldnn_fp16_supported()}"
    )

    cases = [(device, name) for name in PRECISIONS for device in DEVICES]
    steppers = {case: _stepper(case[0], PRECISIONS[case[1]], width) for case in cases}
    for step in steppers.values():
        step()  # warm-up

    def measure(case: tuple, _: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            steppers[case]()
        return (time.perf_counter() - start) / steps * 1000

    times = interleaved(cases, repeats, measure)
    print_table(["device", "precision", "ms per step"], [(*case, spread(times[case])) for case in cases])

    def ratios(numerator: tuple, denominator: tuple) -> list:
        return [a / b for a, b in zip(times[numerator], times[denominator])]

    judged = []
    for name in PRECISIONS:
        target = TARGET if name in ("fp32", "bf16") else None
        ratio = summarize(f"low_precision hpu/cpu {name}", ratios(("hpu", name), ("cpu", name)), target)
        if target is not None:
            judged.append(ratio.median)
    for device in DEVICES:
        for name in ("bf16", "fp16"):
            summarize(f"low_precision {device} {name}/fp32", ratios((device, name), (device, "fp32")), None)
    print(f"low_precision_ratio_max={max(judged):.3f}")


if __name__ == "__main__":
    main()
