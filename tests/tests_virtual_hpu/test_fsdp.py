"""Plain torch FSDP1, FSDP2 and tensor parallelism on the virtual Gaudi over "hccl", two processes.

Each data-parallel rank trains on its own rows (``fsdp_job.py``); the full weights at the end must equal one process
training on all the rows. HCCL has no ``ReduceOp.AVG``, so FSDP2 runs with ``set_force_sum_reduction_for_comms(True)``
on every FSDP module, as it must on a real Gaudi.
"""

from pathlib import Path

import pytest
import torch

import virtual_hpu
from tests_virtual_hpu.fsdp_job import mlp, train
from tests_virtual_hpu.ranks import run_ranks
from virtual_hpu import torch_support

JOB = Path(__file__).with_name("fsdp_job.py")
# FSDP1 places a module without parameters of its own on torch.device(index), a device of torch's accelerator
NEEDS_FSDP1 = pytest.mark.skipif(
    not virtual_hpu.is_torch_accelerator(),
    reason="FSDP1 takes torch's accelerator's current device: on PyPI's CUDA builds hpu is that from torch 2.9",
)
NEEDS_FSDP2 = pytest.mark.skipif(
    not torch_support.fsdp2_sums_on_request(),
    reason="FSDP2 over HCCL, which has no AVG, needs set_force_sum_reduction_for_comms (torch 2.9; not in 2.6)",
)
ELEMENTS = 8 * 16 + 16 + 16 * 8 + 8 + 8 * 4 + 4  # of the MLP's parameters
# the MLP with w1 split by output and w2 by input features (w2's bias stays whole) over 2 ranks
TP_ELEMENTS = (8 * 16 + 16) // 2 + 16 * 8 // 2 + 8 + 8 * 4 + 4


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> Path:
    generator = torch.Generator().manual_seed(1)
    path = tmp_path_factory.mktemp("fsdp") / "batch.pt"
    torch.save({"x": torch.randn(8, 8, generator=generator), "y": torch.randn(8, 4, generator=generator)}, path)
    return path


@pytest.fixture(scope="module")
def ranks(batch) -> list:
    """What each rank reported, by part: ``training``, ``memory``, ``checkpoint``."""
    return run_ranks(JOB, str(batch), str(batch.parent))


@pytest.fixture(scope="module")
def training(ranks) -> list:
    return [results["training"] for results in ranks]


@pytest.fixture(scope="module")
def reference(batch) -> dict:
    """The weights after training in one process on all the rows."""
    rows = torch.load(batch)
    model = mlp().to("hpu")
    train(model, rows["x"], rows["y"])
    return {name: p.detach().cpu() for name, p in model.named_parameters()}


def _assert_weights(ranks: list, key: str, reference: dict, **tolerance) -> None:
    for results in ranks:
        assert isinstance(results[key], dict), results[key]  # else the error the scenario raised
    assert ranks[0][key]["weights"] == ranks[1][key]["weights"], f"{key}: the ranks disagree"
    weights = ranks[0][key]["weights"]
    assert weights.keys() == reference.keys()
    for name, expected in reference.items():
        torch.testing.assert_close(torch.tensor(weights[name]), expected, msg=f"{key} {name}", **tolerance)


@pytest.mark.parametrize(
    ("key", "local"),
    [
        ("fsdp1_FULL_SHARD", ELEMENTS // 2),
        ("fsdp1_SHARD_GRAD_OP", ELEMENTS // 2),
        ("fsdp1_NO_SHARD", ELEMENTS),
        ("fsdp1_HYBRID_SHARD", ELEMENTS // 2),  # a (replicate 1, shard 2) mesh
        ("fsdp1_cpu_offload", ELEMENTS // 2),
    ],
)
@NEEDS_FSDP1
def test_fsdp1_matches_one_process(training, reference, key, local):
    """(HYBRID_SHARD on a (replicate 2, shard 1) mesh is left out: torch's FSDP1 turns it into NO_SHARD over the shard
    group of 1, which never reduces across the replicas, on any device.)"""
    _assert_weights(training, key, reference, rtol=1e-5, atol=1e-6)
    assert [results[key]["local"] for results in training] == [local, local]


@pytest.mark.parametrize(
    ("key", "local", "where"),
    [
        ("fsdp2", ELEMENTS // 2, "hpu"),
        ("fsdp2_cpu_offload", ELEMENTS // 2, "cpu"),  # in pinned host memory
        ("fsdp2_hsdp", ELEMENTS, "hpu"),  # a (replicate 2, shard 1) mesh: all-reduce over the replicas
    ],
)
@NEEDS_FSDP2
def test_fsdp2_matches_one_process(training, reference, key, local, where):
    _assert_weights(training, key, reference, rtol=1e-5, atol=1e-6)
    for rank, results in enumerate(training):
        assert results[key]["local"] == local
        assert results[key]["devices"] == [f"hpu:{rank}" if where == "hpu" else "cpu"]


@pytest.mark.parametrize(
    "key", [pytest.param("fsdp1_bf16", marks=NEEDS_FSDP1), pytest.param("fsdp2_bf16", marks=NEEDS_FSDP2)]
)
def test_bf16_mixed_precision_is_close_to_fp32(training, reference, key):
    """bf16 parameters in forward and backward (FSDP1 also reduces in bf16): close to fp32, but not equal."""
    _assert_weights(training, key, reference, rtol=0, atol=1e-3)
    weights = training[0][key]["weights"]
    assert any(not torch.allclose(torch.tensor(weights[name]), p, rtol=0, atol=1e-6) for name, p in reference.items())


def test_fsdp2_needs_sum_reduction_on_hccl(training):
    """FSDP2 averages gradients with ``ReduceOp.AVG`` unless told to sum and divide, which HCCL refuses."""
    for results in training:
        assert results["fsdp2_avg"].startswith("RuntimeError: HCCL supports the reduce ops SUM, MIN and MAX")
        assert "ReduceOp.AVG" in results["fsdp2_avg"]


def test_dtensor_ops(training):
    """Sharding, redistributing and reducing DTensors on hpu; ``mean`` reduces with ``AVG``, which Gaudi refuses."""
    for rank, results in enumerate(training):
        dtensor = results["dtensor"]
        assert isinstance(dtensor, dict), dtensor
        assert dtensor["local"] == [f"hpu:{rank}", [8, 2]]
        assert dtensor["full_tensor"] and dtensor["to_shard_0"] and dtensor["to_replicate"]
        assert dtensor["partial_to_shard"] == [[3.0, 3.0], [3.0, 3.0]]
        assert dtensor["sum"] == sum(range(32))
        assert dtensor["mean"].startswith("RuntimeError: HCCL supports the reduce ops") and "AVG" in dtensor["mean"]


@pytest.mark.parametrize(
    ("key", "local"),
    [
        ("tp", TP_ELEMENTS),  # a 1-D mesh of 2, both ranks on all rows
        # FSDP2 over a "dp" dimension of 1, TP over "tp" of 2
        pytest.param("dp1_tp2", TP_ELEMENTS, marks=NEEDS_FSDP2),
        # FSDP2 over "dp" of 2 (each rank its own rows), TP over "tp" of 1
        pytest.param("dp2_tp1", ELEMENTS // 2, marks=NEEDS_FSDP2),
    ],
)
def test_tensor_parallel_matches_one_process(training, reference, key, local):
    _assert_weights(training, key, reference, rtol=1e-5, atol=1e-6)
    assert [results[key]["local"] for results in training] == [local, local]
    placements = training[0][key]["placements"]
    if key == "tp":
        assert placements == {
            "w1.weight": "(Shard(dim=0),)",
            "w1.bias": "(Shard(dim=0),)",
            "w2.weight": "(Shard(dim=1),)",
            "w2.bias": "(Replicate(),)",
        }
    else:
        assert placements["w2.weight"] == "(Shard(dim=0), Shard(dim=1))"


@NEEDS_FSDP1
@NEEDS_FSDP2
def test_memory_of_a_rank_halves_under_full_sharding(ranks):
    """Parameters, gradients and Adam's two moments: NO_SHARD holds all on each rank, full sharding about half."""
    for results in (r["memory"] for r in ranks):
        assert isinstance(results, dict), results
        parameters = results["parameter_bytes"]
        assert results["NO_SHARD"] >= 4 * parameters
        assert 0.45 <= results["FULL_SHARD"] / results["NO_SHARD"] <= 0.65, results
        assert 0.45 <= results["fully_shard"] / results["NO_SHARD"] <= 0.65, results


@NEEDS_FSDP1
@NEEDS_FSDP2
def test_sharded_checkpoint_round_trip(ranks):
    """``torch.distributed.checkpoint`` saves each rank's hpu shards of model and Adam state and loads them back."""
    for rank, results in enumerate(r["checkpoint"] for r in ranks):
        assert isinstance(results, dict), results
        for key, kind in (("fsdp2", "DTensor"), ("fsdp1", "ShardedTensor")):
            assert results[key]["saved"] == [f"{kind} hpu:{rank}"]
            assert results[key]["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
            assert results[key]["loaded_equal"] is True
            assert results[key]["next_step_equal"] is True  # the optimizer state came back too


@pytest.mark.skipif(
    not virtual_hpu.is_torch_accelerator(),
    reason="pin_memory() pins for torch's accelerator: on PyPI's CUDA builds hpu is that from torch 2.9",
)
def test_pinned_host_memory():
    """``pin_memory()`` gives host memory that ``is_pinned()`` recognises (FSDP2's CPU offload relies on it); it is not
    device memory."""
    import habana_frameworks.torch.hpu as hthpu

    in_use = hthpu.memory_stats()["InUse"]
    plain = torch.arange(6.0)
    pinned = plain.pin_memory()
    assert not plain.is_pinned()
    assert pinned.is_pinned() and pinned[2:].is_pinned() and pinned.device.type == "cpu"
    assert torch.equal(pinned, plain) and pinned.data_ptr() != plain.data_ptr()
    assert torch.empty(4, pin_memory=True).is_pinned()
    assert torch.equal(pinned.to("hpu", non_blocking=True).cpu(), plain)
    assert hthpu.memory_stats()["InUse"] == in_use
