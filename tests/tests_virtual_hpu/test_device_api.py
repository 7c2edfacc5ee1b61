"""The device module API that torch itself calls on ``torch.hpu`` (DTensor, FSDP, checkpointing, ``fork_rng``), and
the rest of the bridge's ``hpu`` functions, called the way their callers call them."""

from pathlib import Path

import habana_frameworks.torch.hpu as hthpu
import pytest
import torch

from tests_virtual_hpu.ranks import run_ranks
from virtual_hpu import torch_support

TENSOR_PARALLEL_JOB = Path(__file__).parent / "tensor_parallel_job.py"

# every function torch 2.13 calls on a device module (``_device_handle``, ``_get_device_module``,
# ``getattr(torch, device_type)``) in distributed (DTensor, FSDP1/2, checkpoint), amp, dynamo, utils and random
CALLED_BY_TORCH = (
    "Event", "Stream", "current_device", "current_stream", "device", "device_count", "get_device_name",
    "get_rng_state", "is_available", "is_initialized", "memory_allocated", "memory_reserved", "memory_stats",
    "memory_summary", "set_device", "set_rng_ctx", "set_rng_state", "stream", "synchronize", "unset_rng_ctx",
)  # fmt: skip


def test_torch_finds_every_function_it_calls_on_the_device_module():
    missing = [name for name in CALLED_BY_TORCH if not callable(getattr(torch.hpu, name, None))]
    assert not missing


@pytest.mark.skipif(
    torch_support.installed() < torch_support.DTENSOR_RANDOM_SELECTS_HPU_PHILOX,
    reason="DTensor's random initialization takes hpu's philox generator from torch 2.9 (pytorch#156581)",
)
def test_tensor_parallel_weights_created_empty_are_initialized_on_the_mesh_alike_on_both_ranks():
    """``init_module(empty_init=True)`` then ``configure_model``'s tensor parallelism: the strategy materializes the
    weights as DTensors and DTensor's random-number tracker initializes them in the philox context."""
    first, second = run_ranks(TENSOR_PARALLEL_JOB, timeout=600)
    assert first == second  # the full weights, gathered over the mesh
    initial = torch.tensor(first["initial"]["net.0.weight"])
    assert initial.abs().max() <= 1 / 8**0.5  # Linear's uniform initialization bound for 8 inputs
    assert initial.unique().numel() == initial.numel()  # the shards drew different numbers
    assert first["trained"]["net.0.weight"] != first["initial"]["net.0.weight"]


def test_fork_rng_on_hpu_restores_the_generator():
    torch.manual_seed(0)
    expected = torch.rand(3, device="hpu").cpu()
    torch.manual_seed(0)
    with torch.random.fork_rng(devices=[0], device_type="hpu"):
        torch.rand(5, device="hpu")
    assert torch.equal(torch.rand(3, device="hpu").cpu(), expected)


def test_philox_context_reads_and_writes_a_seed_and_an_offset():
    hthpu.manual_seed(11)
    hthpu.set_rng_ctx("philox")
    try:
        state = hthpu.get_rng_state()
        assert state.dtype == torch.uint8 and state.numel() == 16
        assert state.view(torch.int64).tolist() == [11, 0]
        moved = state.clone()
        moved[8:] = torch.tensor([64]).view(torch.uint8)
        hthpu.set_rng_state(moved)
        first = torch.rand(4, device="hpu").cpu()
        assert hthpu.get_rng_state().view(torch.int64).tolist() == [11, 64]
        hthpu.set_rng_state(moved)
        assert torch.equal(torch.rand(4, device="hpu").cpu(), first)  # same seed and offset, same numbers
        hthpu.set_rng_state(state)
        assert not torch.equal(torch.rand(4, device="hpu").cpu(), first)  # another offset, other numbers
    finally:
        hthpu.unset_rng_ctx("philox")
    assert hthpu.get_rng_state().numel() == torch.get_rng_state().numel()  # the shared generator's state again


def test_rng_contexts_are_checked():
    with pytest.raises(ValueError, match="Unknown random-number context 'mt'"):
        hthpu.set_rng_ctx("mt")
    with pytest.raises(RuntimeError, match="without a matching set_rng_ctx"):
        hthpu.unset_rng_ctx("philox")


def test_checkpointing_replays_dropout_with_the_devices_generator():
    """``torch.utils.checkpoint`` saves and restores the device's random state around the recomputed forward."""
    layer = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).to("hpu")
    x = torch.randn(8, 4, device="hpu", requires_grad=True)
    torch.manual_seed(3)
    layer(x).sum().backward()
    expected = x.grad.cpu()
    x.grad = None
    torch.manual_seed(3)
    torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False).sum().backward()
    assert torch.equal(x.grad.cpu(), expected)


def test_rng_state_of_all_devices():
    states = hthpu.get_rng_state_all()
    assert len(states) == hthpu.device_count()
    expected = torch.rand(2, device="hpu").cpu()
    hthpu.set_rng_state_all(states)
    assert torch.equal(torch.rand(2, device="hpu").cpu(), expected)


def test_device_queries_of_the_bridge():
    assert hthpu.get_device_capability() == hthpu.get_device_name() == "GAUDI2"
    assert "GAUDI2" in hthpu.get_device_properties(1)
    assert hthpu.get_arch_list() == ["GAUDI2"]
    assert hthpu.can_device_access_peer(0, 1)
    with pytest.raises(ValueError, match="hpu:9 does not exist"):
        hthpu.get_device_properties(9)
    tensor = torch.ones(256, 1024, device="hpu:1")
    assert hthpu.memory_usage(1) >= tensor.nbytes
    assert "InUse" in hthpu.memory_summary(1)
    with hthpu.device_of(tensor):
        assert hthpu.current_device() == 1
    assert hthpu.current_device() == 0
