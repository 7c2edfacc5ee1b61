"""Process groups of the multi-process HPU strategies, as user code meets them on 2 (and 4) HPUs: Lightning's own gloo
groups (around ``prepare_data``, in ``Fabric.rank_zero_first``), a gloo group of the user's, hybrid sharding on part
of a node, and several stages in one process.

Each scenario runs as a job of its own (Lightning starts its other ranks); a rank that hangs prints where it waits
and fails the run (``--hang-after``).
"""

from pathlib import Path

import pytest

from tests_pytorch.helpers.processes import rank_results, run_ddp, wait
from tests_pytorch.helpers.runif import NEEDS_FSDP2, NO_FSDP2, fsdp2_runs, variants

HELPERS = Path(__file__).parents[1] / "helpers"
STAGES_RUN = HELPERS / "stages_run.py"
FABRIC_RUN = HELPERS / "fabric_groups_run.py"
TRAINER_STRATEGIES = {
    "hpu_parallel": "HPUParallelStrategy",
    "hpu_fsdp": "HPUFSDPStrategy",
    "hpu_model_parallel": "HPUModelParallelStrategy",
    "hpu_deepspeed": "HPUDeepSpeedStrategy",
}
# FSDP with its layers wrapped, as upstream's multi-stage tests have it: a module wrapped at its root alone is left
# sharded by its fit and cannot be tested after it (upstream's FSDPStrategy wraps it again)
STRATEGY_ARGUMENTS = {"hpu_fsdp": ("--sharding", "FULL_SHARD")}
FABRIC_STRATEGIES = {
    "hpu_parallel": "HPUParallelStrategy",
    "hpu_fsdp": "HPUFSDPStrategy",
    "hpu_deepspeed": "HPUDeepSpeedStrategy",
}
STAGES = ["fit", "fit", "test", "predict"]


def _stages(tmp_path: Path, strategy: str, devices: int = 2, *args: str) -> list[dict]:
    arguments = ("--strategy", strategy, "--devices", str(devices), *STRATEGY_ARGUMENTS.get(strategy, ()), *args)
    wait(run_ddp(tmp_path, *arguments, script=STAGES_RUN))
    ranks = rank_results(tmp_path)
    assert len(ranks) == devices
    return ranks


@pytest.mark.parametrize("strategy", variants(sorted(TRAINER_STRATEGIES), kept=["hpu_parallel", "hpu_model_parallel"]))
def test_fit_fit_test_predict_with_prepare_data_and_a_gloo_group_of_the_users(tmp_path, strategy):
    """A DataModule and a LightningModule that override ``prepare_data`` (Lightning guards it with a gloo group),
    and a gloo group made in ``setup``: before, the process group bound to the HPU refused gloo groups ("No backend
    type associated with device type hpu"). Every stage ends on every rank."""
    if strategy == "hpu_model_parallel" and not fsdp2_runs():
        pytest.skip(NO_FSDP2)  # its model is sharded with fully_shard
    ranks = _stages(tmp_path, strategy)
    for rank, result in enumerate(ranks):
        assert result["strategy"] == TRAINER_STRATEGIES[strategy]
        assert result["stages"] == STAGES
        assert result["global_step"] == 4  # two steps in each fit
        assert result["gloo_sums"] == [3.0] * len(STAGES)  # 1 + 2, once per stage
        # local rank 0 prepares, at each stage, the others never
        assert result["prepared"] == ([len(STAGES)] * 2 if rank == 0 else [0, 0])
        assert result["predictions"] == 2


@pytest.mark.heavy
@NEEDS_FSDP2  # with hpu_model_parallel, whose model is sharded with fully_shard
def test_fit_fit_test_predict_on_four_hpus(tmp_path):
    """The sequence that hung with ``ModelParallelStrategy`` on 4 HPUs."""
    for result in _stages(tmp_path, "hpu_model_parallel", 4):
        assert result["stages"] == STAGES
        assert result["gloo_sums"] == [10.0] * len(STAGES)


@pytest.mark.stress
@pytest.mark.parametrize("strategy", ["hpu_parallel", "hpu_fsdp", "hpu_deepspeed"])
def test_fit_fit_test_predict_on_four_hpus_with_every_strategy(tmp_path, strategy):
    for result in _stages(tmp_path, strategy, 4):
        assert result["stages"] == STAGES
        assert result["gloo_sums"] == [10.0] * len(STAGES)


def test_a_group_made_on_one_rank_between_stages_leaves_the_next_stages_running(tmp_path):
    """Rank 0 alone makes a group at the end of the first fit: torch names groups by a count of those made before,
    which then differs between the ranks. The strategies make no group after the first stage's, so the next stages
    run (they used to make their SIGTERM group at each stage and waited for ever in it)."""
    for result in _stages(tmp_path, "hpu_parallel", 2, "--plain", "--hang-after", "120"):
        assert result["stages"] == STAGES


@pytest.mark.parametrize("sharding", variants(["HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"], kept=["HYBRID_SHARD"]))
def test_trainer_hybrid_sharding_on_two_of_eight_hpus_without_a_mesh(tmp_path, sharding):
    """Torch would size the shard groups by the node's 8 HPUs ("group_size (8) must not exceed the world size (2)");
    the strategy gives FSDP the mesh (nodes, devices) = (1, 2)."""
    for result in _stages(tmp_path, "hpu_fsdp", 2, "--sharding", sharding, "--stages", "fit,test"):
        assert result["stages"] == ["fit", "test"]
        assert result["mesh"] == (1, 2)


@pytest.mark.parametrize("strategy", variants(sorted(FABRIC_STRATEGIES), kept=["hpu_parallel"]))
def test_fabric_rank_zero_first_barrier_and_a_gloo_group_of_the_users(tmp_path, strategy):
    wait(run_ddp(tmp_path, "--strategy", strategy, script=FABRIC_RUN))
    ranks = rank_results(tmp_path)
    assert [r["prepared"] for r in ranks] == [[0], [1]]
    for result in ranks:
        assert result["strategy"] == FABRIC_STRATEGIES[strategy]
        assert result["gloo_sum"] == 3.0
        assert len(result["losses"]) == 3


def test_fabric_hybrid_sharding_of_blocks_on_two_of_eight_hpus_without_a_mesh(tmp_path):
    """As a Fabric LLM pretraining script does: ``auto_wrap_policy={Block}``, ``sharding_strategy="HYBRID_SHARD"``."""
    wait(run_ddp(tmp_path, "--strategy", "hpu_fsdp", "--sharding", "HYBRID_SHARD", script=FABRIC_RUN))
    ranks = rank_results(tmp_path)
    assert [r["mesh"] for r in ranks] == [(1, 2), (1, 2)]
    assert all(len(r["losses"]) == 3 for r in ranks)
