"""The "hccl" c10d backend of the virtual Gaudi: collectives on hpu tensors across processes, and DDP over them.

Multi-process tests start one interpreter per rank, as ``torchrun`` would (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT`` and ``VIRTUAL_HPU=1``); each prints its results as one JSON line.
"""

import os
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import virtual_hpu
from tests_virtual_hpu.ranks import run_ranks
from virtual_hpu import torch_support

# Shared by every rank: activate from the environment, join the "hccl" group, report a dict as JSON.
_PRELUDE = """
import json, os, sys
from datetime import timedelta

import torch
import torch.distributed as dist

import virtual_hpu
from virtual_hpu import torch_support

assert virtual_hpu.activate_from_env()
from habana_frameworks.torch.distributed.hccl import initialize_distributed_hpu

world_size, rank, local_rank = initialize_distributed_hpu()
device = torch.device("hpu", local_rank)
torch.hpu.set_device(device)
results = {}


def report():
    print(json.dumps(results), flush=True)
"""

_COLLECTIVES = """
dist.init_process_group("hccl", device_id=torch_support.hpu_group_device(device), timeout=timedelta(seconds=60))
results["init"] = [world_size, rank, local_rank, dist.get_backend(), str(dist.group.WORLD.bound_device_id)]


def attempt(name, fn):
    try:
        results[name] = fn()
    except Exception as error:  # reported to the test, which decides
        results[name] = f"{type(error).__name__}: {error}"


def all_reduce(values, op, dtype=torch.float32):
    tensor = torch.tensor(values[rank], dtype=dtype, device=device)
    dist.all_reduce(tensor, op=op)
    return [str(tensor.device), str(tensor.dtype), tensor.tolist()]


values = [[1.0, -4.0, 2.5], [3.0, 5.0, -1.5]]
for op in ("SUM", "MIN", "MAX"):
    attempt(f"all_reduce_{op}", lambda: all_reduce(values, getattr(dist.ReduceOp, op)))
for op in ("AVG", "PRODUCT", "BAND"):
    attempt(f"unsupported_{op}", lambda: all_reduce(values, getattr(dist.ReduceOp, op)))
attempt("all_reduce_int64", lambda: all_reduce([[2**40, -7], [2**40 + 3, 9]], dist.ReduceOp.SUM, torch.int64))


def async_all_reduce():
    tensor = torch.full((2,), float(rank + 1), device=device)
    values = dist.all_reduce(tensor, async_op=True).get_future().wait()
    return [values[0] is tensor, str(values[0].device), tensor.tolist()]


attempt("async_future", async_all_reduce)


def broadcast():
    tensor = torch.full((3,), float(rank * 10), device=device)
    dist.broadcast(tensor, src=1)
    return [str(tensor.device), tensor.tolist()]


attempt("broadcast", broadcast)


def all_gather():
    outputs = [torch.empty(2, device=device) for _ in range(world_size)]
    dist.all_gather(outputs, torch.tensor([rank, rank + 0.5], device=device))
    return [[str(t.device), t.tolist()] for t in outputs]


attempt("all_gather", all_gather)


def all_gather_into_tensor():
    output = torch.empty(world_size * 2, device=device)
    work = dist.all_gather_into_tensor(output, torch.tensor([rank, -rank], device=device, dtype=torch.float32),
                                       async_op=True)
    chunks = work.get_future().wait()
    return [output.tolist(), sorted({str(t.device) for t in chunks})]


attempt("all_gather_into_tensor", all_gather_into_tensor)
# HCCL takes any shape with world_size times the elements, as SyncBatchNorm's (1, world_size * n) output
attempt("all_gather_into_tensor_flat", lambda: [
    dist.all_gather_into_tensor(flat := torch.empty(1, world_size * 2, device=device),
                                torch.tensor([rank, -rank], device=device, dtype=torch.float32)), flat.tolist()][1])


def reduce_scatter():
    output = torch.empty(2, device=device)
    inputs = [torch.tensor([10.0 * r + rank, rank], device=device) for r in range(world_size)]
    dist.reduce_scatter(output, inputs, op=dist.ReduceOp.MAX)
    return output.tolist()


attempt("reduce_scatter", reduce_scatter)


def reduce_scatter_tensor():
    output = torch.empty(2, device=device)
    dist.reduce_scatter_tensor(output, torch.arange(4, dtype=torch.float32, device=device) * (rank + 1))
    return output.tolist()


attempt("reduce_scatter_tensor", reduce_scatter_tensor)
attempt("reduce_scatter_tensor_flat", lambda: [
    dist.reduce_scatter_tensor(out := torch.empty(2, device=device),
                               torch.arange(4, dtype=torch.float32, device=device).reshape(1, 4) * (rank + 1)),
    out.tolist()][1])
attempt("reduce_scatter_tensor_AVG", lambda: dist.reduce_scatter_tensor(
    torch.empty(2, device=device), torch.ones(4, device=device), op=dist.ReduceOp.AVG))
attempt("barrier", lambda: [dist.barrier(), dist.barrier(async_op=True).wait()])


def send_recv():
    tensor = torch.tensor([7.0, 8.0], device=device) if rank == 0 else torch.zeros(2, device=device)
    if rank == 0:
        dist.send(tensor, dst=1)
    else:
        dist.recv(tensor, src=0)
    return tensor.tolist()


attempt("send_recv", send_recv)


def objects():
    gathered = [None] * world_size
    dist.all_gather_object(gathered, {"rank": rank, "name": f"worker{rank}"})
    broadcast = [{"from": rank}, rank * 100]
    dist.broadcast_object_list(broadcast, src=1)
    on_hpu = [rank]
    dist.broadcast_object_list(on_hpu, src=0, device=device)
    return [gathered, broadcast, on_hpu]


attempt("objects", objects)


def subgroups():
    pair, only_rank_1 = dist.new_group([0, 1]), dist.new_group([1])  # rank 0 is left out of the second
    tensor = torch.full((2,), rank + 1.0, device=device)
    dist.all_reduce(tensor, group=pair)
    if rank == 1:
        dist.all_reduce(tensor, group=only_rank_1, op=dist.ReduceOp.MAX)
    return [dist.get_backend(pair), tensor.tolist()]


attempt("subgroups", subgroups)
dist.destroy_process_group()
results["destroyed"] = not dist.is_initialized()

# No backend named: torch takes the default of the current accelerator, "hccl" for hpu, for hpu alone.
if virtual_hpu.is_torch_accelerator():
    dist.init_process_group(init_method=f"file://{sys.argv[1]}", rank=rank, world_size=world_size)
    attempt("default_backend", lambda: [dist.get_backend_config(), all_reduce(values, dist.ReduceOp.SUM)])
    dist.destroy_process_group()
report()
"""

_DDP = """
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

# bound to the device, as Lightning does where torch can
dist.init_process_group("hccl", device_id=torch_support.hpu_group_device(device), timeout=timedelta(seconds=60))
x, y = (torch.load(sys.argv[1])[k].chunk(world_size)[rank].to(device) for k in ("x", "y"))
for variant in ("default", "gradient_as_bucket_view", "comm_hook"):
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)).to(device)
    model = nn.parallel.DistributedDataParallel(module, gradient_as_bucket_view=variant == "gradient_as_bucket_view")
    if variant == "comm_hook":
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    results[variant] = {
        "devices": sorted({str(t.device) for p in module.parameters() for t in (p, p.grad)}),
        "parameters": [p.tolist() for p in module.parameters()],
    }
    del model
dist.destroy_process_group()
report()
"""


def _run_ranks(code: str, tmp_path: Path, *args: str, world_size: int = 2) -> list[dict]:
    """Run ``code`` (after the prelude) as ``world_size`` ranks; return each rank's reported dict."""
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(_PRELUDE) + textwrap.dedent(code))
    return run_ranks(script, *args, world_size=world_size, timeout=150)


@pytest.fixture(scope="module")
def collectives(tmp_path_factory):
    """Results of the collectives run by two ranks, one dict per rank."""
    tmp_path = tmp_path_factory.mktemp("hccl")
    return _run_ranks(_COLLECTIVES, tmp_path, str(tmp_path / "rendezvous"))


def test_process_group_bound_to_hpu_device(collectives):
    """Bound where torch binds groups to devices other than CUDA's (from 2.7)."""
    for rank, results in enumerate(collectives):
        bound = torch_support.hpu_group_device(torch.device("hpu", rank))
        assert results["init"] == [2, rank, rank, "hccl", str(bound)]
        assert results["destroyed"] is True


@pytest.mark.parametrize(
    ("op", "expected"), [("SUM", [4.0, 1.0, 1.0]), ("MIN", [1.0, -4.0, -1.5]), ("MAX", [3.0, 5.0, 2.5])]
)
def test_all_reduce(collectives, op, expected):
    for rank, results in enumerate(collectives):
        assert results[f"all_reduce_{op}"] == [f"hpu:{rank}", "torch.float32", expected]


@pytest.mark.parametrize("op", ["AVG", "PRODUCT", "BAND"])
def test_unsupported_reduce_ops_raise(collectives, op):
    for results in collectives:
        message = results[f"unsupported_{op}"]
        assert message.startswith("RuntimeError: HCCL supports the reduce ops SUM, MIN and MAX"), message
        assert f"ReduceOp.{op}" in message
    assert "divide by the world size" in collectives[0]["unsupported_AVG"]
    assert collectives[0]["reduce_scatter_tensor_AVG"].startswith("RuntimeError: HCCL supports the reduce ops")


def test_all_reduce_int64(collectives):
    for rank, results in enumerate(collectives):
        assert results["all_reduce_int64"] == [f"hpu:{rank}", "torch.int64", [2**41 + 3, 2]]


def test_async_future_completes_with_the_hpu_tensor(collectives):
    for rank, results in enumerate(collectives):
        assert results["async_future"] == [True, f"hpu:{rank}", [3.0, 3.0]]


def test_broadcast(collectives):
    for rank, results in enumerate(collectives):
        assert results["broadcast"] == [f"hpu:{rank}", [10.0, 10.0, 10.0]]


def test_all_gather(collectives):
    for rank, results in enumerate(collectives):
        assert results["all_gather"] == [[f"hpu:{rank}", [0.0, 0.5]], [f"hpu:{rank}", [1.0, 1.5]]]


def test_all_gather_into_tensor(collectives):
    for rank, results in enumerate(collectives):
        assert results["all_gather_into_tensor"] == [[0.0, 0.0, 1.0, -1.0], [f"hpu:{rank}"]]


def test_tensor_collectives_take_any_shape_of_the_whole(collectives):
    for results in collectives:
        assert results["all_gather_into_tensor_flat"] == [[0.0, 0.0, 1.0, -1.0]]
    assert [results["reduce_scatter_tensor_flat"] for results in collectives] == [[0.0, 3.0], [6.0, 9.0]]


@pytest.mark.skipif(
    torch_support.installed() < torch_support.GLOO_REDUCE_SCATTERS_LISTS,
    reason="the virtual HCCL reduce-scatters lists of tensors with gloo's, which came in torch 2.8",
)
def test_reduce_scatter(collectives):
    assert collectives[0]["reduce_scatter"] == [1.0, 1.0]
    assert collectives[1]["reduce_scatter"] == [11.0, 1.0]


def test_reduce_scatter_tensor(collectives):
    assert collectives[0]["reduce_scatter_tensor"] == [0.0, 3.0]
    assert collectives[1]["reduce_scatter_tensor"] == [6.0, 9.0]


def test_barrier(collectives):
    for results in collectives:
        assert results["barrier"] == [None, True]


def test_send_recv(collectives):
    for results in collectives:
        assert results["send_recv"] == [7.0, 8.0]


def test_object_collectives(collectives):
    for results in collectives:
        gathered, broadcast, on_hpu = results["objects"]
        assert gathered == [{"rank": 0, "name": "worker0"}, {"rank": 1, "name": "worker1"}]
        assert broadcast == [{"from": 1}, 100]
        assert on_hpu == [0]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)).to("hpu")


def test_subgroups(collectives):
    assert collectives[0]["subgroups"] == ["hccl", [3.0, 3.0]]
    assert collectives[1]["subgroups"] == ["hccl", [3.0, 3.0]]


@pytest.mark.skipif(
    not virtual_hpu.is_torch_accelerator(),
    reason="a group without a backend takes torch's accelerator's: on PyPI's CUDA builds hpu is that from torch 2.9",
)
def test_process_group_without_backend_name_uses_hccl_for_hpu(collectives):
    for rank, results in enumerate(collectives):
        assert results["default_backend"] == ["hpu:hccl", [f"hpu:{rank}", "torch.float32", [4.0, 1.0, 1.0]]]


def _train_full_batch(x: torch.Tensor, y: torch.Tensor) -> list:
    module = _model()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    x, y = x.to("hpu"), y.to("hpu")
    for _ in range(3):
        optimizer.zero_grad()
        nn.functional.mse_loss(module(x), y).backward()
        optimizer.step()
    return [p.detach().cpu() for p in module.parameters()]


def test_ddp_matches_full_batch_training(tmp_path):
    generator = torch.Generator().manual_seed(1)
    batch = {"x": torch.randn(16, 8, generator=generator), "y": torch.randn(16, 3, generator=generator)}
    torch.save(batch, tmp_path / "batch.pt")
    ranks = _run_ranks(_DDP, tmp_path, str(tmp_path / "batch.pt"))
    expected = _train_full_batch(batch["x"], batch["y"])
    initial = [p.detach().cpu() for p in _model().parameters()]
    for variant in ("default", "gradient_as_bucket_view", "comm_hook"):
        assert ranks[0][variant]["parameters"] == ranks[1][variant]["parameters"], variant
        for rank, results in enumerate(ranks):
            assert results[variant]["devices"] == [f"hpu:{rank}"]
        trained = [torch.tensor(p) for p in ranks[0][variant]["parameters"]]
        for got, want, before in zip(trained, expected, initial):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            assert not torch.allclose(got, before)  # training moved it


def test_import_registers_the_backend_for_hpu_as_the_bridge_does():
    import habana_frameworks.torch.distributed.hccl  # noqa: F401

    assert dist.Backend("hccl") == "hccl"
    assert dist.Backend.backend_capability["hccl"] == ["hpu"]
    assert dist.Backend.default_device_backend_map["hpu"] == "hccl"
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"


def test_initialize_distributed_hpu(monkeypatch):
    from habana_frameworks.torch.distributed.hccl import initialize_distributed_hpu

    launch = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in launch and "OMPI" not in k})
    assert initialize_distributed_hpu() == (1, -1, -1)
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("localhost", "12345")

    os.environ.update(
        MASTER_PORT="2222", OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_RANK="3", OMPI_COMM_WORLD_LOCAL_RANK="1"
    )
    assert initialize_distributed_hpu() == (4, 3, 1)
    assert os.environ["MASTER_PORT"] == "2222"

    os.environ.update(WORLD_SIZE="8", RANK="5", LOCAL_RANK="5")
    assert initialize_distributed_hpu() == (8, 5, 5)  # torchrun's variables win over MPI's

    assert initialize_distributed_hpu(world_size=2, rank=1, local_rank=0) == (2, 1, 0)
    assert (os.environ["WORLD_SIZE"], os.environ["RANK"], os.environ["LOCAL_RANK"]) == ("2", "1", "0")


def test_initialize_distributed_hpu_takes_the_card_of_the_local_rank_as_habanas_stack_does(monkeypatch):
    from habana_frameworks.torch.distributed.hccl import initialize_distributed_hpu

    names = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "HLS_MODULE_ID", "HABANA_VISIBLE_MODULES", "ID")
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in names and "OMPI" not in k})
    assert initialize_distributed_hpu() == (1, -1, -1)
    assert "HLS_MODULE_ID" not in os.environ and "ID" not in os.environ  # one process: any card

    initialize_distributed_hpu(world_size=4, rank=3, local_rank=3)
    assert (os.environ["HLS_MODULE_ID"], os.environ["ID"]) == ("3", "3")

    del os.environ["HLS_MODULE_ID"]
    os.environ["HABANA_VISIBLE_MODULES"] = "4,5,6,7"
    initialize_distributed_hpu(world_size=4, rank=2, local_rank=2)
    assert os.environ["HLS_MODULE_ID"] == "6"
    initialize_distributed_hpu(world_size=4, rank=3, local_rank=3)
    assert os.environ["HLS_MODULE_ID"] == "6"  # a module id set already is kept

    # more processes on the node than visible cards
    del os.environ["HLS_MODULE_ID"]
    os.environ["HABANA_VISIBLE_MODULES"] = "4,5"
    with pytest.raises(
        AssertionError,
        match=r"^There is not enough devices available for training\. Please verify if"
        r" HABANA_VISIBLE_MODULES is set correctly\.$",
    ):
        initialize_distributed_hpu(world_size=4, rank=2, local_rank=2)
