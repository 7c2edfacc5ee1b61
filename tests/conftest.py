"""Runs each test in the Gaudi execution mode it asks for.

A process fixes its execution mode when it activates the device (``PT_HPU_LAZY_MODE``, read once), so a test
session has one mode: eager, as on current Gaudi software, unless the session starts with ``PT_HPU_LAZY_MODE=1``.
A test that depends on the mode takes a parameter named ``hpu_mode``::

    @pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])  # or ["lazy"] for a lazy-mode-only test
    def test_something(hpu_mode): ...

Tests whose mode is the session's run in the session. The others run in one child pytest session per mode, started
with ``PT_HPU_LAZY_MODE`` set for that mode when the first of them comes up; each reports the child's outcome for
it, as if it had run here (``-x``, ``-v`` and failure details work as usual).
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import pytest
from _pytest.reports import TestReport

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
            item.ihook.pytest_runtest_logreport(report=report)


def pytest_configure(config: pytest.Config) -> None:
    global _report_to
    # popped so that the tests' own subprocesses do not write reports too
    path = os.environ.pop(_REPORTS_VARIABLE, None)
    _report_to = (path, config) if path else None


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


@pytest.fixture
def fresh_compilation_state():
    """Dynamo's caches emptied and the compilation metric at zero, before and after a test that compiles."""
    import torch
    from habana_frameworks.torch.hpu.metrics import metric_global

    torch._dynamo.reset()
    metric_global("graph_compilation").reset()
    yield
    torch._dynamo.reset()
