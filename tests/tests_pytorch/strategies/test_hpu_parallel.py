"""Data-parallel training over HPUs: real gradient synchronisation, DDP options, reductions and scale-out."""

import lightning as L
import pytest
import torch
from lightning.fabric.strategies import DDPStrategy as FabricDDPStrategy
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import DDPStrategy
from torch.nn.parallel import DistributedDataParallel

import pytorch_lightning as pl
from pytorch_lightning.strategies import HPUParallelStrategy
from tests_pytorch.helpers.processes import assert_same_parameters, free_port, rank_results, run_ddp, wait


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """One HPU on whole global batches."""
    out = tmp_path_factory.mktemp("single")
    wait(run_ddp(out, "--devices", "1"))
    (result,) = rank_results(out)
    assert result["strategy"] == "SingleHPUStrategy"
    return result["state"]


@pytest.fixture
def one_rank_here(monkeypatch):
    """A one-process run of the parallel strategy in the test's process: where it meets, and the process group it
    keeps for later runs until the process exits destroyed after the test."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_two_processes_synchronise_gradients(tmp_path, reference):
    wait(run_ddp(tmp_path, "--devices", "2", "--strategy", "hpu_parallel"))
    ranks = rank_results(tmp_path)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert {r["strategy"] for r in ranks} == {"HPUParallelStrategy"}
    # every rank ends with the same weights (gradients were all-reduced, not only the loss) ...
    assert_same_parameters(ranks[0]["state"], ranks[1]["state"])
    # ... which are those of one process on the concatenated batches
    assert_same_parameters(ranks[0]["state"], reference, tolerance=1e-6)
    # the logged loss was reduced as a mean over ranks
    assert ranks[0]["loss"] == pytest.approx(ranks[1]["loss"])


def test_two_processes_train_a_compiled_module(tmp_path, reference):
    """DDP over ``torch.compile(model, backend="hpu_backend")``: the eager+compile path of current Gaudi software."""
    wait(run_ddp(tmp_path, "--devices", "2", "--strategy", "hpu_parallel", "--compile"))
    ranks = rank_results(tmp_path)
    assert all(r["compilations"] > 0 for r in ranks)
    assert_same_parameters(ranks[0]["state"], ranks[1]["state"])
    assert_same_parameters(ranks[0]["state"], reference, tolerance=1e-6)


def test_two_nodes_one_device_each(tmp_path, reference):
    # what "Scale-out on Gaudis" documents: the same script on each node with MASTER_ADDR, MASTER_PORT, NODE_RANK
    port = str(free_port())
    nodes = [
        run_ddp(tmp_path, "--devices", "1", "--num-nodes", "2", MASTER_PORT=port, NODE_RANK=str(rank), WORLD_SIZE="2")
        for rank in (0, 1)
    ]
    wait(*nodes)
    ranks = rank_results(tmp_path)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert_same_parameters(ranks[0]["state"], ranks[1]["state"])
    assert_same_parameters(ranks[0]["state"], reference, tolerance=1e-6)


def test_ddp_options_pass_through(one_rank_here):
    def hook(state, bucket):
        hook.calls += 1
        return torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook(state, bucket)

    hook.calls = 0
    strategy = HPUParallelStrategy(
        find_unused_parameters=True, bucket_cap_mb=2, gradient_as_bucket_view=True, ddp_comm_hook=hook
    )
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        strategy=strategy,
        max_steps=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    seen = {}

    class Inspect(BoringModel):
        def on_train_start(self):
            ddp = self.trainer.strategy.model
            seen.update(
                ddp=isinstance(ddp, DistributedDataParallel),
                unused=ddp.find_unused_parameters,
                bucket=ddp.bucket_bytes_cap,
                view=ddp.gradient_as_bucket_view,
                device=next(ddp.parameters()).device,
            )

    trainer.fit(Inspect())
    assert seen == {
        "ddp": True,
        "unused": True,
        "bucket": 2 * 1024 * 1024,
        "view": True,
        "device": torch.device("hpu", 0),
    }
    assert hook.calls == 2


def test_reductions_emulate_what_hccl_lacks(one_rank_here):
    results = {}

    class Reduce(BoringModel):
        def on_train_start(self):
            strategy = self.trainer.strategy
            results["mean"] = strategy.reduce(torch.tensor(3.0, device=self.device), reduce_op="mean")
            results["sum_long"] = strategy.reduce(torch.tensor(5, device=self.device), reduce_op="sum")
            results["max"] = strategy.reduce(torch.tensor(2.0, device=self.device), reduce_op="max")
            with pytest.raises(ValueError, match="not supported on HPU"):
                strategy.reduce(torch.tensor(1.0, device=self.device), reduce_op="product")

    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        strategy="hpu_parallel",
        max_steps=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    trainer.fit(Reduce())
    assert results["mean"].item() == 3.0 and results["mean"].device.type == "hpu"
    assert results["sum_long"].dtype == torch.int64 and results["sum_long"].item() == 5
    assert results["max"].item() == 2.0


def test_parallel_devices_without_index_mean_one_per_process(one_rank_here):
    # lightning-habana's documented idiom: `parallel_devices=[torch.device("hpu")] * n`
    assert HPUParallelStrategy(parallel_devices=[torch.device("hpu")] * 3).parallel_devices == [
        torch.device("hpu", index) for index in range(3)
    ]
    assert HPUParallelStrategy(parallel_devices=["hpu:1", "hpu:0"]).parallel_devices == [
        torch.device("hpu", 1),
        torch.device("hpu", 0),
    ]
    with pytest.raises(ValueError, match="non-HPU devices"):
        HPUParallelStrategy(parallel_devices=[torch.device("cpu")] * 2)
    with pytest.raises(ValueError, match="more than once"):
        HPUParallelStrategy(parallel_devices=["hpu", "hpu:0"])

    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        strategy=HPUParallelStrategy(parallel_devices=[torch.device("hpu")]),
        max_steps=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    trainer.fit(BoringModel())
    assert trainer.global_step == 1
    assert trainer.strategy.root_device == torch.device("hpu", 0)


def test_ddp_options_are_intels_for_hccl_unless_given():
    """``bucket_cap_mb=230`` and ``gradient_as_bucket_view=True`` (optimum-habana's, Model-References') where the
    user left DDP's own: by name, as an instance of ours or of upstream's ``DDPStrategy``, in the Trainer and Fabric."""
    intel = {"bucket_cap_mb": 230, "gradient_as_bucket_view": True}
    assert HPUParallelStrategy()._ddp_kwargs == intel
    given = HPUParallelStrategy(bucket_cap_mb=25, gradient_as_bucket_view=False)
    assert given._ddp_kwargs == {"bucket_cap_mb": 25, "gradient_as_bucket_view": False}
    for strategy, expected in [
        ("ddp", intel),
        ("ddp_find_unused_parameters_true", {**intel, "find_unused_parameters": True}),
        (DDPStrategy(bucket_cap_mb=50, static_graph=True), {**intel, "bucket_cap_mb": 50, "static_graph": True}),
    ]:
        trainer = pl.Trainer(accelerator="hpu", devices=2, strategy=strategy, logger=False)
        assert type(trainer.strategy) is HPUParallelStrategy and trainer.strategy._ddp_kwargs == expected
    fabric = L.Fabric(accelerator="hpu", devices=2, strategy=FabricDDPStrategy(gradient_as_bucket_view=False))
    assert fabric.strategy._ddp_kwargs == {**intel, "gradient_as_bucket_view": False}
