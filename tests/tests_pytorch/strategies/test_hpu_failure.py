"""``strategies/_failure.py`` in one process: when the rank that started the others kills them after a failure.

A stand-in launcher records the signal; the process group is an in-memory store with this process as rank 0 of 2.
``reliability/test_failing_rank.py`` and ``reliability/test_handled_failure.py`` run the real thing on 2 HPUs.
"""

import itertools
import signal

import pytest
import torch.distributed as dist
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

from pytorch_lightning.strategies import _failure

NUMBER = 7  # the number of the failure in these tests


class Launcher(_SubprocessScriptLauncher):
    """Started one other process (none with ``started=False``); records the signals it would send."""

    def __init__(self, started: bool = True) -> None:
        super().__init__(LightningEnvironment(), num_processes=2, num_nodes=1)
        self.procs = [object()] if started else []  # type: ignore[list-item]
        self.signals: list[int] = []

    def kill(self, signum) -> None:
        self.signals.append(signum)


@pytest.fixture
def store(monkeypatch) -> dist.Store:
    """A process group of 2 in which this process is rank 0, failing for the ``NUMBER``-th time."""
    store = dist.HashStore()
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: store)
    monkeypatch.setattr(_failure, "_failures", itertools.count(NUMBER))
    monkeypatch.setattr(_failure, "TIMEOUT", 0.2)
    return store


def test_a_failure_every_rank_reports_leaves_the_others_alive(store):
    store.set(_failure._key(NUMBER, 1), "failed")
    launcher = Launcher()
    _failure.end_ranks_left_alone(launcher, ValueError("bad batch"))
    assert launcher.signals == []
    assert store.check([_failure._key(NUMBER, 0)])


def test_a_failure_of_this_rank_alone_kills_the_processes_it_started(store, caplog):
    store.set(_failure._key(NUMBER - 1, 1), "failed")  # rank 1 reported an earlier failure, not this one
    launcher = Launcher()
    _failure.end_ranks_left_alone(launcher, ValueError("bad batch"))
    assert launcher.signals == [signal.SIGKILL]
    assert "This rank failed alone: ranks [1] reported no failure within 0.2 s" in caplog.text


def test_other_ranks_only_report(store):
    launcher = Launcher(started=False)
    _failure.end_ranks_left_alone(launcher, ValueError("bad batch"))
    assert launcher.signals == []
    assert store.check([_failure._key(NUMBER, 0)])


def test_ctrl_c_is_left_to_upstream(store):
    launcher = Launcher()
    _failure.end_ranks_left_alone(launcher, KeyboardInterrupt())
    assert launcher.signals == []
    assert not store.check([_failure._key(NUMBER, 0)])


@pytest.mark.parametrize("started", [True, False])
def test_without_a_process_group_the_started_processes_are_killed_at_once(monkeypatch, started):
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    launcher = Launcher(started)
    _failure.end_ranks_left_alone(launcher, ValueError("bad config"))
    assert launcher.signals == ([signal.SIGKILL] if started else [])
