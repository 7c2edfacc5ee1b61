"""Host syncs, graph cuts and compilations in each steady-state training step on one HPU, by logging set-up and
execution mode.

On Gaudi every device-to-host read (``.item()``, ``.cpu()``) makes the host wait for the device. In lazy mode (the
legacy path) ``mark_step()`` also cuts the recorded graph and runs it; in eager mode with ``torch.compile(backend=
"hpu_backend")`` (the default path of current Gaudi software) a step that recompiles stalls instead. The virtual
Gaudi counts all three (``virtual_hpu.accounting``). Each case trains a small model with
``pl.Trainer(accelerator="hpu", devices=1)`` and reads the counters at the start of every training step; after
warm-up it reports the mean per step. Each mode runs in a child process of its own (lazy, eager, eager + compile),
and the table has a column per mode for host syncs and host time. Cases: nothing logged,
``self.log("loss", loss, prog_bar=True)`` every step, ``self.log("loss", loss)`` to a logger with
``log_every_n_steps=50``, both, and the epoch-level progress-bar value (``on_step=False, on_epoch=True``); each with
the progress bar off and with the Trainer's default one; and nothing logged on 2 devices (``hpu_parallel``), from
rank 0.

What logging costs, as measured (host syncs per step, the same in every mode; the graphs themselves do not change):

- ``self.log(..., prog_bar=True)`` with ``on_step=True`` (the default in ``training_step``): 1 every step, with or
  without a progress bar. Upstream's logger connector turns progress-bar values into Python numbers at the end of
  every batch (``_ResultCollection.metrics`` -> ``.item()``); only a change upstream can avoid it
  (Lightning-AI/pytorch-lightning#21232).
- Every ``log_every_n_steps`` steps: one read per value sent to a logger, and one per progress-bar value (logger or
  not).
- The Trainer's default progress bar on HPU: one read per progress-bar value every ``log_every_n_steps`` steps
  (upstream's reads after every step).
- ``self.log(..., prog_bar=True, on_step=False, on_epoch=True)``: none during the epoch; the mean is accumulated on
  the device and read at its end.

The last line, ``host_syncs_per_step_default=<float>``, is the mean host syncs per step in lazy mode of the Trainer's
defaults (progress bar, logger, ``log_every_n_steps=50``) with the loss logged to the progress bar every step, the
common recipe. It needs the virtual Gaudi's counters: on a real Gaudi the script says so and prints ``nan``.

    python benchmarks/graph_cuts.py [--fast] [--steps N]
"""

import json
import os
import statistics
import tempfile
import time
import warnings
from argparse import SUPPRESS, ArgumentParser
from contextlib import redirect_stdout
from dataclasses import dataclass
from typing import Optional

from _common import MODES, is_virtual, print_table, run_in_mode, use_gaudi_or_virtual

use_gaudi_or_virtual()

import torch  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pytorch_lightning as pl  # noqa: E402

WARMUP = 3
HEADLINE_CASE = "prog_bar every step + logger|default"
TWO_PROCESSES = "nothing, 2 processes (rank 0)"


@dataclass(frozen=True)
class Logging:
    name: str
    log_kwargs: Optional[dict]  # for ``self.log("loss", loss, **log_kwargs)``; None logs nothing
    logger: bool  # a CSVLogger with the default ``log_every_n_steps=50``


LOGGING = (
    Logging("nothing", None, logger=False),
    Logging("prog_bar every step", {"prog_bar": True}, logger=False),
    Logging("logger every 50 steps", {}, logger=True),
    Logging("prog_bar every step + logger", {"prog_bar": True}, logger=True),
    Logging("prog_bar epoch mean + logger", {"prog_bar": True, "on_step": False, "on_epoch": True}, logger=True),
)


class LoggingModel(pl.LightningModule):
    """A small classifier that logs its loss as asked and snapshots the counters at the start of every step."""

    def __init__(self, log_kwargs: Optional[dict]) -> None:
        super().__init__()
        self.network = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
        self.log_kwargs = log_kwargs
        self.snapshots: list = []

    def on_train_batch_start(self, batch: tuple, batch_idx: int) -> None:
        from virtual_hpu import accounting

        self.snapshots.append((time.perf_counter(), accounting.counters()))

    def training_step(self, batch: tuple, batch_idx: int) -> Tensor:
        inputs, targets = batch
        loss = nn.functional.cross_entropy(self.network(inputs), targets)
        if self.log_kwargs is not None:
            self.log("loss", loss, **self.log_kwargs)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def measure(logging: Logging, progress_bar: bool, compiled: bool, steps: int, log_dir: str, devices: int = 1) -> dict:
    """Per-step counter increments over ``steps`` steady-state steps (this rank's, with several devices)."""
    torch.manual_seed(0)
    total = WARMUP + steps + 1  # the snapshot at the start of the last step closes the window
    data = TensorDataset(torch.randn(total * 16, 32), torch.randint(0, 2, (total * 16,)))
    model = LoggingModel(logging.log_kwargs)
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=devices,
        max_steps=total,
        enable_progress_bar=progress_bar,
        enable_checkpointing=False,
        enable_model_summary=False,
        logger=CSVLogger(log_dir) if logging.logger else False,
    )
    # the bar draws as usual, into the void instead of over this script's table
    with open(os.devnull, "w") as void, redirect_stdout(void):
        trainer.fit(torch.compile(model, backend="hpu_backend") if compiled else model, DataLoader(data, batch_size=16))
    window = model.snapshots[WARMUP:]
    first, last = window[0][1], window[-1][1]
    delta = {key: last[key] - first[key] for key in first}
    times = [(later - earlier) * 1000 for (earlier, _), (later, _) in zip(window, window[1:])]
    return {
        "mark_steps": delta["mark_steps"] / steps,
        "host_syncs": delta["host_syncs"] / steps,
        "graphs": delta["graphs"] / steps,
        "ops_per_graph": delta["ops"] / delta["graphs"] if delta["graphs"] else 0.0,
        "compilations": delta["graph_compilations"] / steps,
        "ms": statistics.median(times),
    }


def child(mode: str, steps: int, two_processes: bool) -> None:
    """Every case in ``mode`` (already selected by the environment); one JSON line of results by ``case|bar``.

    With ``two_processes``, only the nothing-logged case on 2 devices: Lightning starts rank 1 from this process's
    command line, so the other cases must not run in it."""
    compiled = MODES[mode][1]
    results = {}
    with tempfile.TemporaryDirectory() as log_dir:
        if two_processes:
            results[f"{TWO_PROCESSES}|off"] = measure(LOGGING[0], False, compiled, steps, log_dir, devices=2)
        else:
            for logging in LOGGING:
                for progress_bar in (False, True):
                    case = f"{logging.name}|{'default' if progress_bar else 'off'}"
                    results[case] = measure(logging, progress_bar, compiled, steps, log_dir)
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        print(json.dumps(results))


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="50 steps a case (format smoke test)")
    parser.add_argument("--steps", type=int, default=100, help="steady-state steps per case")
    parser.add_argument("--child", choices=list(MODES), help=SUPPRESS)
    parser.add_argument("--two-processes", action="store_true", help=SUPPRESS)
    args = parser.parse_args()
    steps = 50 if args.fast else args.steps  # 50 still takes in one step of the logger and the default bar
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*number of training batches.*smaller than the logging interval.*")
    if args.child:
        child(args.child, steps, args.two_processes)
        return
    if not is_virtual():
        print("graph_cuts.py reads the virtual Gaudi's counters; run it with VIRTUAL_HPU=1 on a machine without Gaudi")
        print("host_syncs_per_step_default=nan")
        return

    results = {}
    for mode in MODES:
        results[mode] = run_in_mode(__file__, mode, "--steps", str(steps))
        results[mode].update(run_in_mode(__file__, mode, "--steps", str(steps), "--two-processes"))
    lazy, compiled = results["lazy"], results["eager + compile"]
    rows = []
    for case in lazy:
        rows.append(
            [
                *case.split("|"),
                f"{lazy[case]['mark_steps']:.2f}",
                f"{lazy[case]['graphs']:.2f}",
                f"{lazy[case]['ops_per_graph']:.1f}",
                *(f"{results[mode][case]['host_syncs']:.2f}" for mode in MODES),
                f"{compiled[case]['compilations']:.2f}",
                *(f"{results[mode][case]['ms']:.2f}" for mode in MODES),
            ]
        )
    print(f"per training step, mean over {steps} steps after {WARMUP} warm-up steps")
    header = ["logging", "progress bar", "mark_steps (lazy)", "graphs (lazy)", "ops/graph (lazy)"]
    header += [f"host syncs ({mode})" for mode in MODES] + ["compilations (eager + compile)"]
    header += [f"host ms ({mode})" for mode in MODES]
    print_table(header, rows)
    print(f"host_syncs_per_step_default={lazy[HEADLINE_CASE]['host_syncs']:.3f}")


if __name__ == "__main__":
    main()
