"""A failure every rank shares is the script's to handle, as upstream leaves it: every rank stays alive and trains
again. A rank failing alone still ends every process within a minute, non-zero, even when the script handles it.

On 2 HPUs (``run.py handled`` for the Trainer, ``run.py fabric`` for Fabric), with the error raised at step 2.
"""

import re
import time

import pytest

from tests_pytorch.reliability.processes import rank_pids, wait_until_gone

# the whole module's 2-process scenarios start at once and take most of a minute of both cores
pytestmark = pytest.mark.heavy

# runs started together; the tests check them one by one
SCENARIOS = {
    "trainer, every rank": ("handled", "--failing-rank", "-1"),
    "trainer, rank 0 alone": ("handled", "--failing-rank", "0"),
    "trainer fsdp, every rank": ("handled", "--failing-rank", "-1", "--strategy", "hpu_fsdp"),
    "trainer fsdp, rank 0 alone": ("handled", "--failing-rank", "0", "--strategy", "hpu_fsdp"),
    "fabric, every rank": ("fabric", "--failing-rank", "-1", "--handle"),
    "fabric, rank 0 alone": ("fabric", "--failing-rank", "0"),
    "fabric, rank 1 alone": ("fabric", "--failing-rank", "1"),
}
DEADLINE = 60
KILLED = "Killing the processes it started"


@pytest.fixture(scope="module")
def runs(run_module):
    return {name: run_module(*flags, "--devices", "2") for name, flags in SCENARIOS.items()}


def _trained_again(output: str) -> dict[int, str]:
    """Each rank's report of its training after the failure, by rank."""
    return {int(rank): rest for rank, rest in re.findall(r"rank (\d) trained again to (.*)", output)}


@pytest.mark.parametrize("name", ["trainer, every rank", "trainer fsdp, every rank", "fabric, every rank"])
def test_a_failure_of_every_rank_leaves_every_rank_to_the_script(runs, name):
    scenario = runs[name]
    assert scenario.finish(timeout=300) == 0, scenario.output[-3000:]
    output = scenario.output
    assert KILLED not in output
    for rank in (0, 1):
        assert f"rank {rank} handled ValueError('bad batch on rank {rank}')" in output, output[-3000:]
        assert f"rank {rank} finished" in output, output[-3000:]
    trained = _trained_again(output)
    assert trained.keys() == {0, 1}, output[-3000:]
    if name.startswith("fabric"):
        assert trained[0].endswith("all-reduced 1.0")
    else:
        assert trained[0].startswith("step 4:") and trained[1].startswith("step 4:")
    if "fsdp" not in name:
        # the second training synchronised the ranks: the same parameters on both (FSDP's ranks hold shards)
        assert trained[0] == trained[1], trained


@pytest.mark.parametrize(
    "name", ["trainer, rank 0 alone", "trainer fsdp, rank 0 alone", "fabric, rank 0 alone", "fabric, rank 1 alone"]
)
def test_a_rank_failing_alone_ends_every_process(runs, name):
    scenario = runs[name]
    pids = rank_pids(scenario)
    assert len(pids) == 2, scenario.output[-3000:]
    failed_at = time.monotonic()
    assert scenario.finish(timeout=DEADLINE) != 0
    assert wait_until_gone(pids, timeout=max(DEADLINE - (time.monotonic() - failed_at), 1)) is None, scenario.output
    failing = int(name.split(", rank ")[1][0])
    assert f"ValueError: bad batch on rank {failing}" in scenario.output or "handled" in scenario.output
    assert "finished" not in scenario.output
    if name.startswith("trainer"):
        # the script handled it on rank 0, which waited for rank 1's report in vain
        assert "rank 0 handled ValueError('bad batch on rank 0')" in scenario.output
        assert f"[rank: 0] This rank failed alone: ranks [1] reported no failure within 20 s. {KILLED}" in (
            scenario.output
        )
