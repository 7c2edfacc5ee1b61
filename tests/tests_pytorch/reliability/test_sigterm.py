"""SIGTERM to any one rank of ``hpu_parallel`` mid-epoch stops every rank within seconds, at the same step, with
upstream's ``SIGTERMException`` (a ``SystemExit()``: the launcher exits with code 0).

The ranks agree on the signal over a CPU process group (``strategies/_sigterm.py``): an exchange started at the start of
a step and collected a few steps later, when the next one starts, so they stop later than a blocking exchange would,
still at the same step. Upstream's broadcast of a device tensor read back each step hangs the run on a SIGTERM to rank 1
alone.
"""

import os
import re
import signal
import time

import pytest

from tests_pytorch.reliability.processes import wait_until_gone

# the whole module's 2-process scenarios start at once and take most of a minute of both cores
pytestmark = pytest.mark.heavy

STOP_WITHIN, EXIT_WITHIN = 5, 60  # seconds; a 2-process run takes ~10 s to exit after training on a busy machine


@pytest.fixture(scope="module")
def runs(run_module):
    # started together; "fail" without a failing rank trains until stopped
    return {rank: run_module("fail", "--devices", "2", "--strategy", "hpu_parallel") for rank in (0, 1)}


@pytest.mark.parametrize("rank", [0, 1])
def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(runs, rank):
    scenario = runs[rank]
    for _ in range(2):
        scenario.wait_for(" at step 2", timeout=240)
    pids = dict(re.findall(r"rank (\d) \(pid (\d+)\) at step 2", scenario.output))
    assert sorted(pids) == ["0", "1"], scenario.output[-3000:]
    time.sleep(0.5)  # a few steps into the epoch
    signalled = time.monotonic()
    os.kill(int(pids[str(rank)]), signal.SIGTERM)
    for _ in range(2):
        scenario.wait_for(" stopped by ", timeout=STOP_WITHIN)
    stopped = time.monotonic() - signalled
    assert scenario.finish(timeout=EXIT_WITHIN) == 0, scenario.output[-3000:]
    assert wait_until_gone([int(pid) for pid in pids.values()], timeout=EXIT_WITHIN) is None, scenario.output[-3000:]
    gone = time.monotonic() - signalled
    stops = sorted(re.findall(r"rank (\d) stopped by (\w+) at step (\d+)", scenario.output))
    assert [stop[:2] for stop in stops] == [("0", "SIGTERMException"), ("1", "SIGTERMException")], stops
    assert stops[0][2] == stops[1][2], f"the ranks stopped at different steps: {stops}"
    assert f"[rank: {rank}] Received SIGTERM" in scenario.output
    print(f"SIGTERM to rank {rank}: both stopped after {stopped:.1f} s (step {stops[0][2]}), gone after {gone:.1f} s")
