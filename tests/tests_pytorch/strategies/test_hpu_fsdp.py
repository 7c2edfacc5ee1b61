"""FSDP on HPUs: upstream's strategy over HCCL, every sharding strategy equal to one process on the whole batches,
CUDA names and flags, precision, refusals."""

import pytest
import torch
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException

import pytorch_lightning as pl
from pytorch_lightning.plugins import HPUFSDPPrecision, HPUPrecisionPlugin
from pytorch_lightning.strategies import HPUFSDPStrategy
from tests_pytorch.helpers.processes import assert_same_parameters, rank_results, run_ddp, wait
from tests_pytorch.helpers.runif import VARIANT, variants

# ddp_run.py's regression model with two targets: 16 * 8 + 8 + 8 * 2 + 2 parameters, each tensor with at least as
# many rows as there are processes (see the sharded checkpoint test)
TWO_OUTPUTS = ("--outputs", "2")
PARAMETERS = 154


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict:
    """``ddp_run.py``'s model trained on one HPU on whole global batches, by number of epochs."""
    outs = {epochs: tmp_path_factory.mktemp(f"single{epochs}") for epochs in (1, 2)}
    wait(*(run_ddp(out, "--devices", "1", "--max-epochs", str(epochs), *TWO_OUTPUTS) for epochs, out in outs.items()))
    return {epochs: rank_results(out)[0] for epochs, out in outs.items()}


@pytest.fixture(scope="module")
def reference(references) -> dict:
    return references[1]["state"]


@pytest.mark.parametrize(
    ("arguments", "sharded"),
    [
        (("--sharding", "FULL_SHARD"), True),
        pytest.param(("--sharding", "SHARD_GRAD_OP"), True, marks=VARIANT),
        pytest.param(("--sharding", "NO_SHARD"), False, marks=VARIANT),
        (("--strategy", "hpu_fsdp_cpu_offload"), True),
        (("--sharding", "FULL_SHARD", "--activation-checkpointing"), True),
        # one replica of two shards: hybrid sharding over the (replicas, shards) mesh
        pytest.param(("--sharding", "HYBRID_SHARD", "--mesh", "1,2"), True, marks=VARIANT),
    ],
    ids=["full_shard", "shard_grad_op", "no_shard", "cpu_offload", "activation_checkpointing", "hybrid_shard"],
)
def test_two_processes_end_where_one_process_on_the_whole_batches_does(tmp_path, reference, arguments, sharded):
    wait(run_ddp(tmp_path, "--devices", "2", *arguments, *TWO_OUTPUTS))
    ranks = rank_results(tmp_path)
    assert [r["strategy"] for r in ranks] == ["HPUFSDPStrategy"] * 2 and [r["world_size"] for r in ranks] == [2, 2]
    # rank 0 gathers the full weights: those of one process on the concatenated batches
    assert_same_parameters(ranks[0]["state"], reference, tolerance=1e-6)
    # each rank holds its shard only, unless nothing is sharded
    expected = [PARAMETERS // 2] * 2 if sharded else [PARAMETERS] * 2
    assert [r["local_numel"] for r in ranks] == expected


def test_cuda_names_and_bf16_mixed_precision(tmp_path, reference):
    """A script moved from CUDA keeps ``strategy="fsdp"``; bf16 parameters and reduction, autocast on the HPU."""
    wait(run_ddp(tmp_path, "--devices", "2", "--strategy", "fsdp", "--precision", "bf16-mixed", *TWO_OUTPUTS))
    ranks = rank_results(tmp_path)
    assert ranks[0]["strategy"] == "HPUFSDPStrategy"
    assert_same_parameters(ranks[0]["state"], reference, tolerance=2e-2)


@pytest.mark.parametrize(
    ("strategy", "cpu_offload"), [("fsdp", False), ("hpu_fsdp", False), ("fsdp_cpu_offload", True)]
)
@pytest.mark.parametrize(
    ("precision", "dtype"), [(None, torch.float32), ("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16)]
)
def test_names_resolve_to_the_hpu_strategy_and_precision(strategy, cpu_offload, precision, dtype):
    trainer = pl.Trainer(accelerator="hpu", devices=2, strategy=strategy, precision=precision, logger=False)
    assert type(trainer.strategy) is HPUFSDPStrategy and isinstance(trainer.strategy, FSDPStrategy)
    assert trainer.strategy.cpu_offload.offload_params is cpu_offload
    plugin = trainer.precision_plugin
    assert type(plugin) is HPUFSDPPrecision and isinstance(plugin, HPUPrecisionPlugin)
    assert plugin.mixed_precision_config.param_dtype == dtype
    with plugin.forward_context():
        a = torch.ones(2, 2, device="hpu")
        assert (a @ a).dtype == dtype


def test_bad_inputs_are_refused_before_any_work():
    with pytest.raises(ValueError, match=r"FSDP does not train in `precision='fp8'` on HPUs.*'bf16-mixed'"):
        pl.Trainer(accelerator="hpu", devices=2, strategy="fsdp", precision="fp8")
    with pytest.raises(MisconfigurationException, match=r"\[HPUMixedPrecision\(...\)\]` does not run on HPU with FSDP"):
        pl.Trainer(accelerator="hpu", devices=2, strategy="fsdp", plugins=[HPUPrecisionPlugin("bf16-mixed")])
    with pytest.raises(
        ValueError, match=r"would replicate the model 2 times without ever reducing across the replicas"
    ):
        HPUFSDPStrategy(sharding_strategy="HYBRID_SHARD", device_mesh=(2, 1))
    with pytest.raises(MisconfigurationException, match=r"strategy=HPUFSDPStrategy\(\)\)` runs on HPUs but"):
        pl.Trainer(accelerator="cpu", devices=2, strategy=HPUFSDPStrategy())


@pytest.mark.heavy
@pytest.mark.parametrize("kind", variants(["full", "sharded"], kept=["full"]))
def test_checkpoints_resume_two_processes_where_an_uninterrupted_run_ends(tmp_path, references, kind):
    """Model, optimizer (momentum), scheduler and epoch come back from a full checkpoint (one file, loaded into the
    sharded model) or a sharded one (a folder, one shard per rank), which Lightning's and torch's converters turn
    into one file."""
    checkpoint, first, resumed = tmp_path / "fsdp.ckpt", tmp_path / "first", tmp_path / "resumed"
    first.mkdir(), resumed.mkdir()
    arguments = ("--devices", "2", "--sharding", "FULL_SHARD", "--state-dict", kind, *TWO_OUTPUTS)
    wait(run_ddp(first, *arguments, "--checkpoint", str(checkpoint)))
    assert checkpoint.is_file() if kind == "full" else checkpoint.is_dir()
    wait(run_ddp(resumed, *arguments, "--max-epochs", "2", "--resume", str(checkpoint)))
    ranks = rank_results(resumed)
    assert [r["global_step"] for r in ranks] == [references[2]["global_step"]] * 2 == [8, 8]
    assert ranks[0]["lr"] == pytest.approx(references[2]["lr"])
    assert_same_parameters(ranks[0]["state"], references[2]["state"], tolerance=1e-6)
    if kind == "sharded":
        _check_converters(checkpoint, tmp_path, rank_results(first)[0]["state"])


def _check_converters(checkpoint, tmp_path, expected: dict) -> None:
    import subprocess
    import sys

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    command = [sys.executable, "-m", "lightning.pytorch.utilities.consolidate_checkpoint", str(checkpoint)]
    result = subprocess.run([*command, "--output_file", str(tmp_path / "one.ckpt")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    consolidated = torch.load(tmp_path / "one.ckpt", weights_only=False)
    assert consolidated["global_step"] == 4
    assert_same_parameters({k: v.float() for k, v in consolidated["state_dict"].items()}, expected, tolerance=1e-6)
    dcp_to_torch_save(checkpoint, tmp_path / "torch.pt")
    model = torch.load(tmp_path / "torch.pt", weights_only=False)["model"]
    assert_same_parameters({k: v.float() for k, v in model.items()}, expected, tolerance=1e-6)


def test_an_upstream_fsdp_strategy_instance_becomes_the_hpu_strategy_with_its_settings():
    from torch.distributed.fsdp import ShardingStrategy

    upstream = FSDPStrategy(sharding_strategy="SHARD_GRAD_OP", cpu_offload=True, state_dict_type="sharded")
    trainer = pl.Trainer(accelerator="hpu", devices=2, strategy=upstream, precision="bf16-mixed", logger=False)
    strategy = trainer.strategy
    assert type(strategy) is HPUFSDPStrategy and strategy is not upstream and type(upstream) is FSDPStrategy
    assert strategy.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP and strategy.cpu_offload.offload_params
    assert strategy._get_process_group_backend() == "hccl"
    assert type(trainer.precision_plugin) is HPUFSDPPrecision
