"""Runs each test in the Gaudi execution mode it asks for.

A process fixes its execution mode when it activates the device (``PT_HPU_LAZY_MODE``, read once), so a test
session has one mode: eager, as on current Gaudi software, unless the session starts with ``PT_HPU_LAZY_MODE=1``.
A test that depends on the mode takes a parameter named ``hpu_mode``::

    @pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])  # or ["lazy"] for a lazy-mode-only test
    def test_something(hpu_mode): ...

Tests whose mode is the session's run in the session. The others run in one child pytest session per mode, started
with ``PT_HPU_LAZY_MODE`` set for that mode when the first of them comes up; each reports the child's outcome for
it, as if it had run here (``-x``, ``-v`` and failure details work as usual).

Under pytest-xdist (``make test`` runs ``-n 2 --dist loadfile``: whole files per worker) each worker is a process of its
own: it activates the device and starts the child sessions it needs itself, and this module keeps the workers from
getting in each other's way (see ``_share_the_machine_between_workers``).

Every test must leave the process as it found it (environment, process group, torch's global settings): see
``leave_the_process_as_found``.
"""

import errno
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import pytest
from _pytest.reports import TestReport

import process_state


def _share_the_machine_between_workers() -> None:
    """In a pytest-xdist worker (and in the child sessions it starts, which inherit its environment):

    * a share of the cores: ``OMP_NUM_THREADS`` is the cores divided by the workers unless it is set, for the worker
      (torch reads it when it is first imported, after this module) and every process its tests start. Two workers
      each running a thread per core on two cores wait on each other's spinning threads.
    * ports of its own: a socket bound to port 0 ("any free port") in the worker gets the next free one of a block
      below the kernel's ephemeral range, one block per worker. That is how the tests pick ``MASTER_PORT`` for the
      ranks they start (``free_port``, ``find_free_network_port``: bind to 0, read the port, close), so the ports of
      two workers can never be the same, and no port the kernel hands out for a connection or another ``bind(0)`` on
      the machine is one of them either. The port is then bound again by a rank, so a block is walked in turn rather
      than from its start each time.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if not worker.startswith("gw") or workers < 1:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cores // workers)))

    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    first, block = 10000, (ephemeral - 10000) // workers
    if block < 100:
        return
    start = first + int(worker[2:]) * block
    ports = range(start, start + block)
    position = random.randrange(block)  # a child session of this worker starts elsewhere in the block
    bind = socket.socket.bind

    def bind_in_this_workers_block(self: socket.socket, address) -> None:
        nonlocal position
        if self.family not in (socket.AF_INET, socket.AF_INET6) or not isinstance(address, tuple) or address[1] != 0:
            return bind(self, address)
        for _ in range(block):
            port = ports[position]
            position = (position + 1) % block
            try:
                return bind(self, (address[0], port, *address[2:]))
            except OSError as error:
                if error.errno not in (errno.EADDRINUSE, errno.EACCES):
                    raise
        return bind(self, address)  # the whole block taken: any port, as asked

    socket.socket.bind = bind_in_this_workers_block


_share_the_machine_between_workers()

MODES = ("eager", "lazy")
SESSION_MODE = "lazy" if os.environ.get("PT_HPU_LAZY_MODE", "").strip() == "1" else "eager"
_REPORTS_VARIABLE = "HPU_MODE_CHILD_REPORTS"  # set in a child session: where it writes its test reports

_elsewhere: dict[str, list[str]] = {mode: [] for mode in MODES}  # node ids to run in a child session, per mode
_children: dict[str, "_ChildSession"] = {}
_report_to: Optional[tuple[str, pytest.Config]] = None  # in a child session: the reports file and the config


def _mode_of(item: pytest.Item) -> Optional[str]:
    callspec = getattr(item, "callspec", None)
    mode = callspec.params.get("hpu_mode") if callspec is not None else None
    if mode is not None and mode not in MODES:
        raise pytest.UsageError(f"{item.nodeid}: hpu_mode must be one of {MODES}, got {mode!r}")
    return mode


class _ChildSession:
    """One pytest run of the given tests in a fresh process in ``mode``, with their serialized reports."""

    def __init__(self, mode: str, node_ids: list[str], rootpath: Path) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "reports.jsonl"
            env = {**os.environ, "PT_HPU_LAZY_MODE": "1" if mode == "lazy" else "0", _REPORTS_VARIABLE: str(path)}
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *node_ids]
            child = subprocess.run(command, cwd=rootpath, env=env, capture_output=True, text=True)
            lines = path.read_text().splitlines() if path.exists() else []
        self.mode = mode
        self.output = child.stdout[-4000:] + child.stderr[-4000:]
        self.reports: dict[str, list[dict]] = {}
        for line in lines:
            data = json.loads(line)
            self.reports.setdefault(data["nodeid"], []).append(data)

    def replay(self, item: pytest.Item) -> None:
        """Report ``item``'s outcome in the child as this session's."""
        config = item.config
        reports = [
            config.hook.pytest_report_from_serializable(config=config, data=data)
            for data in self.reports.get(item.nodeid, [])
        ]
        if not reports:
            message = f"did not run in the child session in {self.mode} mode; its output ends with:\n{self.output}"
            reports = [TestReport(item.nodeid, item.location, {}, "failed", message, "call")]
        for report in reports:
            if report.skipped and isinstance(report.longrepr, list):
                # JSON made the (path, line, reason) of a skip a list; pytest's summary of skips wants a tuple
                report.longrepr = tuple(report.longrepr)
            item.ihook.pytest_runtest_logreport(report=report)


# how many HPUs the hardware tier may use, for the child sessions of other modes too
_HPUS_VARIABLE = "PL_TEST_HPUS"
_VIRTUAL_TIER = Path(__file__).parent / "tests_virtual_hpu"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--hpus",
        type=int,
        default=None,
        help="How many HPUs the hardware tier (`-m hpu`) may use, the first N of the node; default: all visible.",
    )


def pytest_configure(config: pytest.Config) -> None:
    global _report_to
    hpus = config.getoption("--hpus")
    if hpus is not None:
        if hpus < 1:
            raise pytest.UsageError(f"--hpus must be a positive number of HPUs, got {hpus}")
        os.environ[_HPUS_VARIABLE] = str(hpus)
    # popped so that the tests' own subprocesses do not write reports too
    path = os.environ.pop(_REPORTS_VARIABLE, None)
    _report_to = (path, config) if path else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier before ``-m`` selects (``tests_pytorch/helpers/runif.py``): the one ``RunIf`` put
    it in, and ``virtual_hpu`` for every test of ``tests/tests_virtual_hpu``, which is skipped where the virtual Gaudi
    is not active (real hardware, or the rehearsal)."""
    from tests_pytorch.helpers.runif import VIRTUAL_HPU, RunIf, tier_of

    virtual_only = RunIf(virtual_hpu=True)
    for item in items:
        tier = tier_of(item)
        if tier is None and _VIRTUAL_TIER in Path(str(item.path)).parents:
            item.add_marker(virtual_only)
            tier = VIRTUAL_HPU
        if tier is not None:
            item.add_marker(tier)


@pytest.fixture
def hpus() -> int:
    """How many HPUs a hardware-tier test may use: ``--hpus``, or every HPU this process sees."""
    import torch

    visible = torch.hpu.device_count()
    wanted = int(os.environ.get(_HPUS_VARIABLE, visible))
    if wanted > visible:
        pytest.fail(f"--hpus {wanted} asks for more HPUs than the {visible} this process sees", pytrace=False)
    return wanted


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        mode = _mode_of(item)
        if mode is not None and mode != SESSION_MODE:
            _elsewhere[mode].append(item.nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Optional[bool]:
    mode = _mode_of(item)
    if mode is None or mode == SESSION_MODE:
        return None
    if mode not in _children:
        _children[mode] = _ChildSession(mode, _elsewhere[mode], item.config.rootpath)
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    _children[mode].replay(item)
    # what the skipped protocol would have torn down: the module of an earlier test that ran here, when this test
    # is the last of its module (pytest's own runner does this through the same private state)
    item.session._setupstate.teardown_exact(nextitem)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def pytest_runtest_logreport(report: TestReport) -> None:
    if _report_to is not None:
        path, config = _report_to
        data = config.hook.pytest_report_to_serializable(config=config, report=report)
        with open(path, "a") as file:
            file.write(json.dumps(data) + "\n")


@pytest.fixture(autouse=True)
def leave_the_process_as_found(request: pytest.FixtureRequest):
    """Fails a test that leaves the environment, a process group or a torch setting changed, after putting it back,
    so that no later test runs differently for it (see ``process_state``). Autouse fixtures of this conftest are set
    up first and torn down last, after the test's own fixtures (``monkeypatch``) have undone their changes."""
    before = process_state.snapshot()
    yield
    leaks = process_state.restore(before)
    if leaks:
        pytest.fail(process_state.describe(request.node.nodeid, leaks), pytrace=False)


@pytest.fixture
def fresh_compilation_state():
    """Dynamo's caches emptied and the compilation metric at zero, before and after a test that compiles."""
    import torch
    from habana_frameworks.torch.hpu.metrics import metric_global

    torch._dynamo.reset()
    metric_global("graph_compilation").reset()
    yield
    torch._dynamo.reset()
