"""The demo's model trained on one HPU in each execution mode: what every steady-state training step costs.

Current Gaudi software runs in eager mode and compiles with ``torch.compile(backend="hpu_backend")``; lazy mode
(``PT_HPU_LAZY_MODE=1``) is the legacy path. Each mode is fixed per process, so each fit runs in a child process of
this script; the modes take turns (lazy, eager, eager + compile), the order flipping every repetition. The model is the
digit classifier of ``examples/pytorch/hpu_classifier.py`` with nothing logged, on full batches. Per step after
warm-up the table gives host syncs, graphs ended by a cut (lazy), graph compilations (compile; a recompilation would
show here), graph breaks in the training step, and the median host time per step, median [min, max] over
repetitions. On the virtual Gaudi the ratios lazy ÷ eager and compiled ÷ eager (the median over repetitions of each
repetition's ratio of median step times, with min and max) have no target, as the host CPU is not a Gaudi (the
virtual backend runs the compiled graph's ops one by one, so it saves no launch overhead).

The last line, ``compilations_per_step_compiled=<float>``, is the headline: 0 means no step recompiles after warm-up.
Counts need the virtual Gaudi's counters: on a real Gaudi the script says so and prints ``nan``.

    python benchmarks/execution_modes.py [--fast] [--repeats N] [--steps N]
"""

import json
import statistics
import sys
import time
from argparse import SUPPRESS, ArgumentParser
from pathlib import Path

from _common import (
    MODES,
    QUIET_TRAINER,
    interleaved,
    is_virtual,
    print_table,
    run_in_mode,
    spread,
    summarize,
    use_gaudi_or_virtual,
)

use_gaudi_or_virtual()
WARMUP = 5
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "pytorch"


def child(mode: str, steps: int) -> None:
    """Train in ``mode`` (already selected by the environment) and print one JSON line of per-step figures."""
    sys.path.insert(0, str(EXAMPLES))
    import torch
    from hpu_classifier import DigitsClassifier
    from torch.utils.data import DataLoader, TensorDataset

    import pytorch_lightning as pl

    if not is_virtual():
        print(json.dumps(None))
        return
    from virtual_hpu import accounting

    class Quiet(DigitsClassifier):
        """The demo's network, logging nothing, with the counters read at the start of every step."""

        snapshots: list = []

        def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
            images, labels = batch
            return torch.nn.functional.cross_entropy(self(images), labels)

        def on_train_batch_start(self, batch: tuple, batch_idx: int) -> None:
            self.snapshots.append((time.perf_counter(), accounting.counters()))

    torch.manual_seed(0)
    total = WARMUP + steps + 1  # the snapshot at the start of the last step closes the window
    data = TensorDataset(torch.rand(total * 64, 1, 8, 8), torch.randint(0, 10, (total * 64,)))
    model = Quiet()
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        max_steps=total,
        **QUIET_TRAINER,
    )
    compiled = MODES[mode][1]
    trainer.fit(torch.compile(model, backend="hpu_backend") if compiled else model, DataLoader(data, batch_size=64))
    window = model.snapshots[WARMUP:]
    first, last = window[0][1], window[-1][1]
    per_step = {key: (last[key] - first[key]) / steps for key in ("host_syncs", "graphs", "graph_compilations")}
    per_step["graph_breaks"] = last["graph_breaks"]
    per_step["ms"] = statistics.median((b - a) * 1000 for (a, _), (b, _) in zip(window, window[1:]))
    print(json.dumps(per_step))


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="fewer steps (format smoke test)")
    parser.add_argument("--repeats", type=int, default=3, help="fits per mode")
    parser.add_argument("--steps", type=int, default=60, help="steady-state steps per fit")
    parser.add_argument("--child", choices=list(MODES), help=SUPPRESS)
    args = parser.parse_args()
    repeats, steps = (1, 10) if args.fast else (args.repeats, args.steps)
    if args.child:
        child(args.child, steps)
        return
    results = interleaved(list(MODES), repeats, lambda mode, _: run_in_mode(__file__, mode, "--steps", str(steps)))
    if any(result is None for fits in results.values() for result in fits):
        print("execution_modes.py reads the virtual Gaudi's counters; run it with VIRTUAL_HPU=1 without a Gaudi")
        print("compilations_per_step_compiled=nan")
        return
    rows = []
    for mode, fits in results.items():
        last = fits[-1]  # the counts are the same in every fit: the last one's
        counts = [f"{last['host_syncs']:.2f}", f"{last['graphs']:.2f}", f"{last['graph_compilations']:.2f}"]
        rows.append([mode, *counts, last["graph_breaks"], spread([fit["ms"] for fit in fits])])
    print(
        f"per training step of the demo model, one HPU, nothing logged, mean over {steps} steps after {WARMUP};"
        f" {repeats} fit(s) per mode"
    )
    header = ["mode", "host syncs", "graphs (lazy cuts)", "compilations", "graph breaks", "host ms"]
    print_table(header, rows)
    for mode in ("lazy", "eager + compile"):
        ratios = [fit["ms"] / eager["ms"] for fit, eager in zip(results[mode], results["eager"])]
        summarize(f"{mode} ÷ eager, step time", ratios, None)
    compilations = max(fit["graph_compilations"] for fit in results["eager + compile"])
    print(f"compilations_per_step_compiled={compilations:.3f}")


if __name__ == "__main__":
    main()
