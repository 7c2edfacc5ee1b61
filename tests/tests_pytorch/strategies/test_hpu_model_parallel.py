"""FSDP2 and tensor parallelism on HPUs (``strategy="model_parallel"``): equal to one process on the whole batches,
DTensor parameters on the HPU, names, refusals."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException

import pytorch_lightning as pl
from pytorch_lightning.plugins import HPUPrecisionPlugin
from pytorch_lightning.strategies import HPUModelParallelStrategy
from tests_pytorch.helpers.processes import assert_same_parameters, free_port, rank_results, run_ddp, wait
from tests_pytorch.helpers.runif import NEEDS_FSDP2

MODEL_PARALLEL_RUN = Path(__file__).parents[1] / "helpers" / "model_parallel_run.py"
# ddp_run.py's regression model with two targets
PARAMETERS = 154


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict:
    """``ddp_run.py``'s model with two targets on one HPU on whole global batches, by number of epochs."""
    outs = {epochs: tmp_path_factory.mktemp(f"single{epochs}") for epochs in (1, 2)}
    arguments = ("--devices", "1", "--outputs", "2", "--max-epochs")
    wait(*(run_ddp(out, *arguments, str(epochs)) for epochs, out in outs.items()))
    return {epochs: rank_results(out)[0] for epochs, out in outs.items()}


@pytest.fixture(scope="module")
def reference(references) -> dict:
    return references[1]["state"]


@pytest.mark.parametrize("tensor_parallel", [pytest.param(1, marks=NEEDS_FSDP2), 2], ids=["fsdp2", "tensor_parallel"])
def test_two_processes_end_where_one_process_on_the_whole_batches_does(tmp_path, reference, tensor_parallel):
    """``fully_shard`` over 2 data-parallel HPUs (each its own rows), or the MLP split column- and row-wise over 2
    tensor-parallel HPUs (the same rows): the full weights equal one process's, and each rank holds about half."""
    wait(run_ddp(tmp_path, "--tensor-parallel", str(tensor_parallel), script=MODEL_PARALLEL_RUN))
    ranks = rank_results(tmp_path)
    assert [r["strategy"] for r in ranks] == ["HPUModelParallelStrategy"] * 2
    assert all(r["dtensor"] for r in ranks) and [r["devices"] for r in ranks] == [{"hpu:0"}, {"hpu:1"}]
    for rank in ranks:
        assert_same_parameters(rank["state"], reference, tolerance=1e-6)
    assert sum(r["local_numel"] for r in ranks) <= PARAMETERS + 2 and max(r["local_numel"] for r in ranks) < PARAMETERS


def test_names_and_instances_resolve_to_the_hpu_strategy():
    for strategy in ("model_parallel", ModelParallelStrategy(tensor_parallel_size=2), "hpu_model_parallel"):
        trainer = pl.Trainer(accelerator="hpu", devices=2, strategy=strategy, precision="bf16-mixed", logger=False)
        assert type(trainer.strategy) is HPUModelParallelStrategy
        assert isinstance(trainer.strategy, ModelParallelStrategy)
        assert isinstance(trainer.precision_plugin, HPUPrecisionPlugin)
        assert trainer.strategy._get_process_group_backend() == "hccl"


def test_fp8_is_refused_before_any_work():
    with pytest.raises(MisconfigurationException, match=r"`precision='fp8'` does not run with FSDP2.*'bf16-mixed'"):
        pl.Trainer(accelerator="hpu", devices=2, strategy="model_parallel", precision="fp8")


@pytest.mark.heavy
@NEEDS_FSDP2
def test_a_distributed_checkpoint_resumes_where_an_uninterrupted_run_ends(tmp_path, references):
    """Model (DTensor shards), optimizer momentum, scheduler and epoch come back from a distributed checkpoint."""
    checkpoint, first, resumed = tmp_path / "model_parallel.ckpt", tmp_path / "first", tmp_path / "resumed"
    first.mkdir(), resumed.mkdir()
    wait(run_ddp(first, "--checkpoint", str(checkpoint), script=MODEL_PARALLEL_RUN))
    assert checkpoint.is_dir()
    wait(run_ddp(resumed, "--max-epochs", "2", "--resume", str(checkpoint), script=MODEL_PARALLEL_RUN))
    for rank in rank_results(resumed):
        assert rank["global_step"] == references[2]["global_step"] == 8
        assert rank["lr"] == pytest.approx(references[2]["lr"])
        assert_same_parameters(rank["state"], references[2]["state"], tolerance=1e-6)


# where torch's FSDP2 cannot be told to sum (before 2.9), the script runs as it would there: without the method
REFUSAL = """
import torch, pytorch_lightning as pl
from torch.distributed.fsdp import FSDPModule, fully_shard
from pytorch_lightning.demos.boring_classes import BoringModel
if hasattr(FSDPModule, "set_force_sum_reduction_for_comms"):
    del FSDPModule.set_force_sum_reduction_for_comms
class Sharded(BoringModel):
    def configure_model(self):
        fully_shard(self.layer, mesh=self.device_mesh["data_parallel"])
trainer = pl.Trainer(accelerator="hpu", devices=1, strategy="model_parallel", max_steps=1, logger=False,
                     enable_checkpointing=False)
try:
    trainer.fit(Sharded())
except RuntimeError as error:
    print("REFUSED", error, "STEPS", trainer.global_step)
"""


def test_fsdp2_is_refused_before_any_step_where_torch_cannot_sum_its_gradients(tmp_path):
    """HCCL cannot average: before torch 2.9 FSDP2 could not be told to sum, and would fail in its first
    reduce-scatter (or average wrongly): the strategy names the torch needed before the first step."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", REFUSAL], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "REFUSED `ModelParallelStrategy` shards the model with FSDP2" in result.stdout, result.stdout
    assert "requires PyTorch 2.9 or higher" in result.stdout and result.stdout.rstrip().endswith("STEPS 0")
