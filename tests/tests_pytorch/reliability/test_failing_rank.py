"""When one rank of ``hpu_parallel`` fails, every process ends within a minute, non-zero, with the original error shown;
SIGTERM to the launcher stops every rank.

The sibling of the failing rank is stuck outside any collective, the hardest case: a backend that notices a dead peer
(gloo does) cannot help, only the processes themselves can.
"""

import signal
import time

import pytest

from tests_pytorch.reliability.processes import rank_pids, wait_until_gone

# the whole module's 2-process scenarios start at once and take most of a minute of both cores
pytestmark = pytest.mark.heavy

# runs of the "fail" scenario, started together; the tests check them one by one
SCENARIOS = {
    "rank 1 raises, rank 0 stuck": ("--failing-rank", "1", "--stuck-rank", "0"),
    "rank 0 raises, rank 1 stuck": ("--failing-rank", "0", "--stuck-rank", "1"),
    "SIGTERM to the launcher": (),
}
DEADLINE = 60


@pytest.fixture(scope="module")
def runs(run_module):
    return {
        name: run_module("fail", "--devices", "2", "--strategy", "hpu_parallel", *flags)
        for name, flags in SCENARIOS.items()
    }


@pytest.mark.parametrize(("name", "failing"), [("rank 1 raises, rank 0 stuck", 1), ("rank 0 raises, rank 1 stuck", 0)])
def test_failing_rank_ends_every_process(runs, name, failing):
    scenario = runs[name]
    pids = rank_pids(scenario)
    assert len(pids) == 2, scenario.output[-3000:]
    # the failure happens at step 3, right after step 2 was reported
    failed_at = time.monotonic()
    code = scenario.finish(timeout=DEADLINE)
    assert code != 0
    assert wait_until_gone(pids, timeout=max(DEADLINE - (time.monotonic() - failed_at), 1)) is None, scenario.output
    assert f"RuntimeError: injected failure on rank {failing}" in scenario.output


def test_sigterm_to_the_launcher_stops_every_rank(runs):
    scenario = runs["SIGTERM to the launcher"]
    pids = rank_pids(scenario)
    assert len(pids) == 2
    scenario.signal(signal.SIGTERM)
    # upstream stops gracefully: its SIGTERMException is a `SystemExit()`, so the launcher exits with code 0
    scenario.finish(timeout=DEADLINE)
    assert wait_until_gone(pids, timeout=DEADLINE) is None, scenario.output
    assert "[rank: 0] Received SIGTERM" in scenario.output and "[rank: 1] Received SIGTERM" in scenario.output
