"""Shared by the benchmarks in this folder (``run_all.py`` skips files starting with ``_``)."""

import importlib.util
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

_Case = TypeVar("_Case")
_Result = TypeVar("_Result")

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
# each execution mode by name: (PT_HPU_LAZY_MODE, whether the model is compiled with ``backend="hpu_backend"``);
# the mode is fixed per process, so a benchmark runs each in a child process of its own
MODES = {"lazy": ("1", False), "eager": ("0", False), "eager + compile": ("0", True)}


def use_gaudi_or_virtual() -> None:
    """Train on the real Gaudi where its software is installed, on the virtual one otherwise, with one intra-op
    thread per process unless ``OMP_NUM_THREADS`` says otherwise.

    On a shared machine with few cores, ops that wait for a second intra-op thread make step times swing tenfold;
    both sides of every comparison get the same setting. Must run before ``torch`` and ``pytorch_lightning`` are
    imported: the variables are read at import and inherited by workers.
    This folder leaves the import path (a module here must never shadow a package: ``import torch`` imports
    ``virtual_hpu._autoload``), and the repository's sources are used when the package is not installed.
    """
    sys.path[:] = [path for path in sys.path if Path(path or ".").resolve() != HERE]
    if importlib.util.find_spec("pytorch_lightning") is None:
        sys.path.append(str(SRC))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VIRTUAL_HPU", "0" if importlib.util.find_spec("habana_frameworks") else "1")


def is_virtual() -> bool:
    import virtual_hpu

    return virtual_hpu.is_active()


def run_in_mode(script: str, mode: str, *args: str) -> object:
    """Run ``script --child <mode> *args`` with the mode's ``PT_HPU_LAZY_MODE`` and return the JSON value its last
    line of output prints."""
    env = {**os.environ, "PT_HPU_LAZY_MODE": MODES[mode][0], "MASTER_ADDR": os.environ.get("MASTER_ADDR", "127.0.0.1")}
    command = [sys.executable, script, "--child", mode, *args]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{Path(script).name} in {mode} mode failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def spread(samples: Sequence[float], digits: int = 2) -> str:
    """``median [min, max]`` of the samples."""
    return f"{statistics.median(samples):.{digits}f} [{min(samples):.{digits}f}, {max(samples):.{digits}f}]"


def print_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A Markdown table, columns as wide as their widest cell."""
    cells = [list(map(str, header))] + [list(map(str, row)) for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (width + 2) for width in widths) + "|")
    print("\n".join(lines), flush=True)


def interleaved(
    cases: Sequence[_Case], repeats: int, measure: Callable[[_Case, int], _Result]
) -> dict[_Case, list[_Result]]:
    """Measure every case ``repeats`` times, alternating the order each round so that neither side always runs
    first: drifts of a noisy machine then fall on both sides alike. ``measure`` gets the case and the round."""
    results: dict = {case: [] for case in cases}
    for repeat in range(repeats):
        for case in cases if repeat % 2 == 0 else list(reversed(cases)):
            results[case].append(measure(case, repeat))
    return results


def step_clock(warmup: int) -> tuple:
    """(callback, milliseconds): a Trainer callback noting when each training step starts, and the function giving
    the milliseconds between consecutive steps after the first ``warmup``. Call it after ``use_gaudi_or_virtual()``.
    """
    import time

    from lightning.pytorch import Callback

    starts: list = []

    class _Clock(Callback):
        def on_train_batch_start(self, *args: object) -> None:
            starts.append(time.perf_counter())

    def milliseconds() -> list:
        kept = starts[warmup:]
        return [(b - a) * 1000 for a, b in zip(kept, kept[1:])]

    return _Clock(), milliseconds


def launch_pair(script: str, arguments: Sequence[str], **environment: str) -> dict:
    """Start ``script --worker ...`` as the 2 processes of a job, as ``torchrun`` would, and return the JSON that rank 0
    printed last. ``MASTER_PORT`` is the first of the ports the processes' fits take one after the other
    (``next_fit_group``)."""
    from lightning.fabric.plugins.environments.lightning import find_free_network_port

    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(find_free_network_port()), **environment}
    processes = [
        subprocess.Popen(
            [sys.executable, script, "--worker", *arguments],
            env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [process.communicate() for process in processes]
    for process, (_, stderr) in zip(processes, outputs):
        if process.returncode != 0:
            raise RuntimeError(f"a process exited with {process.returncode}:\n{stderr[-6000:]}")
    return json.loads(outputs[0][0].strip().splitlines()[-1])


def fit_groups() -> Callable[[], None]:
    """In a process of ``launch_pair``: call the returned function before each fit. Each fit gets a process group of its
    own, on a port of its own: a rank that starts the next group before the other rank has destroyed the last one
    would otherwise find the old group's store and stale addresses. Lightning's teardown takes the rank variables
    away; they are put back, as torchrun set them, for loops that read them."""
    base_port = int(os.environ["MASTER_PORT"])
    launched = {name: os.environ[name] for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    fits = iter(range(1_000))

    def next_fit() -> None:
        os.environ["MASTER_PORT"] = str(base_port + next(fits))
        os.environ.update(launched)

    return next_fit


def step_ratios(results: dict, numerator: str, denominator: str) -> list:
    """Median-step-time ratios of the fits of two kinds taken one after the other (results of ``interleaved``)."""
    pairs = zip(results[numerator], results[denominator])
    return [statistics.median(top["ms"]) / statistics.median(bottom["ms"]) for top, bottom in pairs]


def seeded_mlp(width: int, classes: int) -> Any:
    """The MLP ``width x width x width x classes`` that the step benchmarks train, with the same weights in every
    process. Call it after ``use_gaudi_or_virtual()``."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, classes)
    )
