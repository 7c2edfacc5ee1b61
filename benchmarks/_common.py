"""Shared by the benchmarks in this folder (``run_all.py`` skips files starting with ``_``)."""

import faulthandler
import importlib.util
import itertools
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional, TypeVar

_Case = TypeVar("_Case")
_Result = TypeVar("_Result")

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
# each execution mode by name: (PT_HPU_LAZY_MODE, whether the model is compiled with ``backend="hpu_backend"``);
# the mode is fixed per process, so a benchmark runs each in a child process of its own
MODES = {"lazy": ("1", False), "eager": ("0", False), "eager + compile": ("0", True)}
# the longest a child process of a benchmark may take: a hung child (a rank waiting for a peer that died, a port taken
# by another program) fails the benchmark instead of stalling ``make bench``
CHILD_TIMEOUT = 20 * 60.0
STACKS_AFTER = 4 * 60.0  # seconds into a fit of ``fit_groups``: the ranks' Python stacks go to stderr


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


def run_process(command: Sequence[str], env: Optional[dict] = None, timeout: float = CHILD_TIMEOUT) -> tuple:
    """(return code, stdout, stderr) of ``command``, run in a session of its own. After ``timeout`` seconds, or when
    this process is interrupted, it is killed with every process it started (ranks that Lightning starts, compilers),
    so none is left behind holding a port or a core; a timeout then raises ``RuntimeError``."""
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException as err:
        kill_group(process)
        if isinstance(err, subprocess.TimeoutExpired):
            raise RuntimeError(f"{' '.join(command)} was still running after {timeout:.0f} s: stopped") from err
        raise
    return process.returncode, stdout, stderr


def kill_group(process: subprocess.Popen) -> None:
    """Kill ``process``, started with ``start_new_session=True``, and every process it started."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # all gone already
    process.wait()


def run_in_mode(script: str, mode: str, *args: str) -> object:
    """Run ``script --child <mode> *args`` with the mode's ``PT_HPU_LAZY_MODE`` and return the JSON value its last
    line of output prints."""
    env = {**os.environ, "PT_HPU_LAZY_MODE": MODES[mode][0], "MASTER_ADDR": os.environ.get("MASTER_ADDR", "127.0.0.1")}
    code, stdout, stderr = run_process([sys.executable, script, "--child", mode, *args], env)
    if code != 0:
        raise RuntimeError(f"{Path(script).name} in {mode} mode failed:\n{stderr[-3000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def spread(samples: Sequence[float], digits: int = 2) -> str:
    """``median [min, max]`` of the samples."""
    return f"{statistics.median(samples):.{digits}f} [{min(samples):.{digits}f}, {max(samples):.{digits}f}]"


@dataclass(frozen=True)
class Ratio:
    """A headline figure of a benchmark, usually a ratio of two times: the median of one value per repetition, with
    the smallest and largest of them, against the target the median must not exceed (``None``: reported, not
    judged).

    Each value comes from one repetition of interleaved measurements (``interleaved``), so a slow moment of a shared
    machine moves one value, not the median: a regression shows as a shift of the median, noise as a wider spread.
    ``str()`` gives the line every benchmark prints and ``run_all.py`` reads back with ``parse``::

        ratio <name> = <median> [<min>, <max>] (target ≤ <target>: met|missed)
    """

    name: str
    median: float
    low: float
    high: float
    target: Optional[float] = None

    LINE = re.compile(
        r"^ratio (?P<name>.+?) = (?P<median>\S+) \[(?P<low>\S+), (?P<high>\S+)\]"
        r" \((?:target ≤ (?P<target>\S+): (?:met|missed)|no target)\)$"
    )

    @classmethod
    def of(cls, name: str, samples: Sequence[float], target: Optional[float]) -> "Ratio":
        return cls(name, statistics.median(samples), min(samples), max(samples), target)

    @property
    def status(self) -> str:
        if self.target is None:
            return "no target"
        # judged as printed, so that a line read back says the same
        return "met" if round(self.median, 3) <= self.target else "missed"

    @property
    def spread(self) -> str:
        """``median [min, max]``, to 3 decimals."""
        return f"{self.median:.3f} [{self.low:.3f}, {self.high:.3f}]"

    def __str__(self) -> str:
        judged = "no target" if self.target is None else f"target ≤ {self.target:g}: {self.status}"
        return f"ratio {self.name} = {self.spread} ({judged})"

    @classmethod
    def parse(cls, line: str) -> Optional["Ratio"]:
        """The ratio a line printed by ``summarize`` states, or ``None`` for any other line."""
        match = cls.LINE.match(line.strip())
        if match is None:
            return None
        target = None if match["target"] is None else float(match["target"])
        return cls(match["name"], float(match["median"]), float(match["low"]), float(match["high"]), target)


def summarize(name: str, samples: Sequence[float], target: Optional[float]) -> Ratio:
    """Print the ratio line of ``samples`` (one value per interleaved repetition) and return the ``Ratio``."""
    ratio = Ratio.of(name, samples, target)
    print(ratio, flush=True)
    return ratio


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


def lockstep(start_loop: Callable[[], Any], loop_at_end: bool, counters: Callable[[], dict] = dict) -> Any:
    """A Trainer callback that times the Trainer against a hand-written loop in lockstep: it takes one step of the loop
    inside every Trainer step, at the step's start or, with ``loop_at_end``, at its end (alternate between
    repetitions), so that each Trainer step is paired with a loop step taken at nearly the same moment of a noisy
    machine. A Trainer step is the time between the starts of two consecutive training steps minus the loop step
    inside it. Call it after ``use_gaudi_or_virtual()``.

    ``start_loop()``, called when training starts, returns the loop: an object whose ``step()`` takes one step and
    whose ``close()``, called when training ends, returns what the benchmark checks (its final loss, ...), kept as
    ``closed``. ``counters()`` gives running counts (host syncs, graphs), read at the start of every Trainer step and
    around every loop step. After the fit, ``ms(warmup)`` gives the paired step times and ``per_step(warmup)`` the
    counts per step of each.
    """
    from lightning.pytorch import Callback

    class _Lockstep(Callback):
        def __init__(self) -> None:
            self.step_starts: list = []
            self.step_counters: list = []  # at the start of each Trainer step
            self.loop_seconds: list = []
            self.loop_counts: list = []  # what each loop step added to the counters
            self.loop: Any = None
            self.closed: Any = None

        def on_train_start(self, *args: object) -> None:
            self.loop = start_loop()

        def _loop_step(self) -> None:
            before, start = counters(), time.perf_counter()
            self.loop.step()
            self.loop_seconds.append(time.perf_counter() - start)
            after = counters()
            self.loop_counts.append({key: after[key] - before[key] for key in after})

        def on_train_batch_start(self, *args: object) -> None:
            self.step_starts.append(time.perf_counter())
            self.step_counters.append(counters())
            if not loop_at_end:
                self._loop_step()

        def on_train_batch_end(self, *args: object) -> None:
            if loop_at_end:
                self._loop_step()

        def on_train_end(self, *args: object) -> None:
            self.closed = self.loop.close()

        def ms(self, warmup: int) -> dict:
            """Milliseconds of each Trainer step (but the last, which has no next start) and of the loop step paired
            with it, after the first ``warmup``: ``{"trainer": [...], "loop": [...]}``."""
            starts, inside = self.step_starts, self.loop_seconds
            trainer = [later - earlier - loop for earlier, later, loop in zip(starts, starts[1:], inside)]
            return {
                "trainer": [seconds * 1000 for seconds in trainer[warmup:]],
                "loop": [seconds * 1000 for seconds in inside[warmup : len(trainer)]],
            }

        def per_step(self, warmup: int) -> Optional[dict]:
            """``{"trainer": counts, "loop": counts}`` per step after the first ``warmup``, or ``None`` without
            counters."""
            window = self.step_counters[warmup:]
            if len(window) < 2 or not window[0]:
                return None
            count, keys = len(window) - 1, window[0].keys()
            loop_counts = self.loop_counts[warmup : len(self.step_starts) - 1]
            loop = {key: sum(counts[key] for counts in loop_counts) for key in keys}
            return {
                "trainer": {key: (window[-1][key] - window[0][key] - loop[key]) / count for key in keys},
                "loop": {key: loop[key] / count for key in keys},
            }

    return _Lockstep()


def paired_ratio(fit: dict) -> float:
    """The median over a fit's steps of each Trainer step ÷ the loop step paired with it (``ms`` of ``lockstep``)."""
    return statistics.median(trainer / loop for trainer, loop in zip(fit["trainer"], fit["loop"]))


def free_port() -> int:
    """A TCP port that no socket on this machine holds now: bind to port 0, read what the kernel gave, close."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_pair(script: str, arguments: Sequence[str], timeout: float = CHILD_TIMEOUT, **environment: str) -> dict:
    """Start ``script --worker ...`` as the 2 processes of a job, as ``torchrun`` would, and return the JSON that rank 0
    printed last. ``MASTER_PORT`` is where rank 0 serves the store that ``fit_groups`` agrees on ports through.

    When a process fails, the other is killed at once (it would wait for its peer up to the process group's timeout,
    30 minutes), and both are killed after ``timeout`` seconds."""
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **environment}
    # files, not pipes: a process that fills a pipe nobody reads yet would block
    outputs = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(2)]
    processes = [
        subprocess.Popen(
            [sys.executable, script, "--worker", *arguments],
            env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"},
            stdout=stdout,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
        for rank, (stdout, stderr) in enumerate(outputs)
    ]
    try:
        problem, rank = _wait_all(processes, timeout)
    except BaseException:  # interrupted: leave no rank behind
        for process in processes:
            kill_group(process)
        raise
    texts = []
    for stdout, stderr in outputs:
        stdout.seek(0), stderr.seek(0)
        texts.append((stdout.read(), stderr.read()))
        stdout.close(), stderr.close()
    if problem:
        other = 1 - rank
        raise RuntimeError(
            f"{Path(script).name}: {problem}:\n{texts[rank][1][-6000:]}\n--- rank {other}:\n{texts[other][1][-2000:]}"
        )
    return json.loads(texts[0][0].strip().splitlines()[-1])


def _wait_all(processes: Sequence[subprocess.Popen], timeout: float) -> tuple:
    """(what went wrong or "", the rank to report on): wait for every process, and kill them all as soon as one fails
    or the time is up."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [process.poll() for process in processes]
        failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            problem = f"rank {failed[0]} exited with {codes[failed[0]]}"
        elif time.monotonic() > deadline:
            problem = f"still running after {timeout:.0f} s"
        elif None not in codes:
            return "", 0
        else:
            time.sleep(0.2)
            continue
        for process in processes:
            kill_group(process)
        return problem, failed[0] if failed else 0


def fit_groups() -> Callable[[], None]:
    """In a process of ``launch_pair``: call the returned function before each fit. Each fit gets a process group of its
    own, on a port of its own: a rank that starts the next group before the other rank has destroyed the last one
    would otherwise find the old group's store and stale addresses. Rank 0 picks a free port just before each fit and
    passes it to rank 1 through a store on the launch's ``MASTER_PORT``, kept for the whole job (ports counted up from
    ``MASTER_PORT`` could be taken by another program, and a rank would then wait for its peer until the group's
    timeout). Lightning's teardown takes the rank variables away; they are put back, as torchrun set them, for loops
    that read them."""
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    launched = {name: os.environ[name] for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        is_master=rank == 0,
        timeout=timedelta(minutes=5),
    )
    fits = itertools.count()
    used: set = set()

    def next_fit() -> None:
        key = f"port of fit {next(fits)}"
        if rank == 0:
            port = free_port()
            while port in used:  # a port the kernel hands out again may still be known to the other rank's last group
                port = free_port()
            used.add(port)
            store.set(key, str(port))
        os.environ["MASTER_PORT"] = store.get(key).decode()
        os.environ.update(launched)
        # a fit that hangs (a rank waiting for its peer) prints where each thread is, for the error ``launch_pair``
        # raises when it stops the ranks
        faulthandler.dump_traceback_later(STACKS_AFTER)

    return next_fit


def step_ratios(results: dict, numerator: str, denominator: str) -> list:
    """Median-step-time ratios of the fits of two kinds taken one after the other (results of ``interleaved``)."""
    pairs = zip(results[numerator], results[denominator])
    return [statistics.median(top["ms"]) / statistics.median(bottom["ms"]) for top, bottom in pairs]


def classifier(base: type, network: Callable[[], Any]) -> Any:
    """A LightningModule of class ``base`` (ours, or a peer's Lightning) that trains ``network()`` with cross-entropy
    and AdamW (lr 1e-3), as the benchmarks' hand-written loops do, keeping its last loss as ``last_loss``."""
    import torch

    class Classifier(base):  # type: ignore[valid-type, misc]
        def __init__(self) -> None:
            super().__init__()
            self.network = network()
            self.last_loss: Any = None

        def training_step(self, batch: tuple, batch_idx: int) -> Any:
            inputs, targets = batch
            loss = torch.nn.functional.cross_entropy(self.network(inputs), targets)
            self.last_loss = loss.detach()
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return Classifier()


# Trainer flags that leave a benchmark's steps to the training itself: no logging, checkpoints, bar or summary
QUIET_TRAINER = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


def weights_digest(module: Any) -> str:
    """A fingerprint of the module's weights, equal only when they are equal bit for bit."""
    import hashlib

    weights = b"".join(p.detach().float().cpu().numpy().tobytes() for p in module.parameters())
    return hashlib.sha1(weights).hexdigest()[:12]


def seeded_mlp(width: int, classes: int) -> Any:
    """The MLP ``width x width x width x classes`` that the step benchmarks train, with the same weights in every
    process. Call it after ``use_gaudi_or_virtual()``."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, classes)
    )


def rank_rows(steps: int, rank: int, batch: int, width: int, classes: int, ranks: int) -> Any:
    """This rank's share of each of ``steps`` global batches of ``batch * ranks`` random rows (the same in every
    process), in order, as a ``TensorDataset``. Call it after ``use_gaudi_or_virtual()``."""
    import torch
    from torch.utils.data import TensorDataset

    generator = torch.Generator().manual_seed(1)
    samples = steps * batch * ranks
    inputs = torch.randn(samples, width, generator=generator)
    targets = torch.randint(0, classes, (samples,), generator=generator)
    return TensorDataset(inputs[rank::ranks], targets[rank::ranks])
