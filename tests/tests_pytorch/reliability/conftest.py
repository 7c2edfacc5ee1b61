"""Fixtures that start ``run.py`` scenarios and kill whatever is left of them afterwards."""

import pytest

from tests_pytorch.reliability.processes import Run


def _starter():
    started: list[Run] = []

    def start(*args: str, **env: str) -> Run:
        started.append(Run(*args, **env))
        return started[-1]

    return start, started


@pytest.fixture
def run():
    """Start scenarios with ``run("train", "--dir", ...)``; whatever is left of them is killed at teardown."""
    start, started = _starter()
    yield start
    for scenario in started:
        scenario.kill()


@pytest.fixture(scope="module")
def run_module():
    """As ``run``, for scenarios a module's tests share (started together, so they overlap)."""
    start, started = _starter()
    yield start
    for scenario in started:
        scenario.kill()
