"""Repeated multi-process runs, to catch what a single run shows only now and then (an abort at exit, a hang).

Opt-in: ``pytest -m stress tests/tests_pytorch/strategies/test_hpu_parallel_stress.py``; ``STRESS_RUNS`` (default 100)
sets the repetitions of each scenario. Every run must exit with 0 on every process and leave each rank's result.
"""

import os

import pytest

from tests_pytorch.helpers.processes import free_port, rank_results, run_ddp

RUNS = int(os.environ.get("STRESS_RUNS", "100"))

# (arguments of each process, its extra environment) per scenario
SCENARIOS = {
    "two_nodes_one_device_each": [
        (("--devices", "1", "--num-nodes", "2"), {"NODE_RANK": "0", "WORLD_SIZE": "2"}),
        (("--devices", "1", "--num-nodes", "2"), {"NODE_RANK": "1", "WORLD_SIZE": "2"}),
    ],
    "two_devices": [(("--devices", "2", "--strategy", "hpu_parallel"), {})],
}


@pytest.mark.stress
@pytest.mark.timeout(RUNS * 300)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_repeated_runs_exit_cleanly(scenario, tmp_path):
    abnormal = []
    for run in range(RUNS):
        out = tmp_path / str(run)
        out.mkdir()
        port = str(free_port())
        processes = [run_ddp(out, *args, MASTER_PORT=port, **env) for args, env in SCENARIOS[scenario]]
        for process in processes:
            output, _ = process.communicate(timeout=240)
            if process.returncode != 0:
                abnormal.append((run, process.returncode, output[-2000:]))
        if len(rank_results(out)) != 2:
            abnormal.append((run, "missing results", sorted(path.name for path in out.iterdir())))
        # progress, for runs stopped before the end (visible with `-s`)
        print(f"{scenario} run {run + 1}/{RUNS}: {len(abnormal)} abnormal so far", flush=True)
    print(f"{scenario}: {RUNS} runs, {len(abnormal)} abnormal")
    assert not abnormal, abnormal
