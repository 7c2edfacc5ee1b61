"""What ``HPUPerformanceMonitor`` costs: the demo's training step with and without it, side by side in one run.

Each fit trains ``examples/pytorch/hpu_classifier.py``'s model on one HPU along the demo's default path (eager mode,
compiled with ``hpu_backend``; lazy mode when ``PT_HPU_LAZY_MODE=1``), with the monitor or without; the two kinds
alternate, the order swapping every repeat. It prints median [min, max] milliseconds per step after warm-up for each,
the monitor's report of the last fit, and last ``monitor_overhead_ratio=<float>``: the median of the with/without
ratios of the median step times of fits taken one after the other (target <= 1.03).

    python benchmarks/performance_monitor.py [--fast] [--repeats N] [--epochs N]
"""

import sys
import warnings
from argparse import ArgumentParser
from pathlib import Path

from _common import (
    QUIET_TRAINER,
    interleaved,
    print_table,
    spread,
    step_clock,
    step_ratios,
    summarize,
    use_gaudi_or_virtual,
)

use_gaudi_or_virtual()
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "pytorch"))

import torch  # noqa: E402
from hpu_classifier import DigitsClassifier, DigitsDataModule  # noqa: E402

import pytorch_lightning as pl  # noqa: E402
from pytorch_lightning.accelerators import HPUAccelerator  # noqa: E402
from pytorch_lightning.callbacks import HPUPerformanceMonitor  # noqa: E402

WARMUP = 5
TARGET = 1.03
KINDS = ("without", "with monitor")


def fit(kind: str, epochs: int) -> dict:
    pl.seed_everything(42, verbose=False)
    clock, milliseconds = step_clock(WARMUP)
    monitor = HPUPerformanceMonitor(verbose=False)
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        max_epochs=epochs,
        callbacks=[clock, monitor] if kind != "without" else [clock],
        **QUIET_TRAINER,
    )
    model = DigitsClassifier()
    runner = model if HPUAccelerator.is_lazy() else torch.compile(model, backend="hpu_backend")
    trainer.fit(runner, datamodule=DigitsDataModule())
    return {"ms": milliseconds(), "report": monitor.report()}


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="one short fit of each kind (smoke test)")
    parser.add_argument("--repeats", type=int, default=4, help="fits of each kind")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per fit")
    args = parser.parse_args()
    repeats, epochs = (1, 1) if args.fast else (args.repeats, args.epochs)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")

    results = interleaved(KINDS, repeats, lambda kind, _: fit(kind, epochs))
    rows = [[kind, spread([ms for result in fits for ms in result["ms"]])] for kind, fits in results.items()]
    ratios = step_ratios(results, "with monitor", "without")
    mode = "lazy" if HPUAccelerator.is_lazy() else "eager + compile"
    print(f"demo classifier, one HPU ({HPUAccelerator.describe()}, {mode}), {repeats} fit(s) x {epochs} epoch(s) each")
    print_table(["HPUPerformanceMonitor", "ms/step"], rows)
    print(results["with monitor"][-1]["report"])
    ratio = summarize("with monitor ÷ without, step time", ratios, TARGET)
    print(f"monitor_overhead_ratio={ratio.median:.3f}")


if __name__ == "__main__":
    main()
