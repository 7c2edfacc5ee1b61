"""One rank of the FSDP checks of ``test_fsdp.py``: plain torch FSDP1, FSDP2 and tensor parallelism over "hccl".

Usage: ``fsdp_job.py BATCH_FILE WORK_DIR``, started by ``ranks.run_ranks`` (one process per rank). ``training`` trains
the same small MLP every way, each data-parallel rank on its own rows of the batch, and reports the full weights and
the elements this rank holds; ``memory`` reports the peak device memory of training under each sharding;
``checkpoint`` saves and loads sharded state dicts with ``torch.distributed.checkpoint`` in ``WORK_DIR``. The results
of the three are printed as one JSON line.
"""

import gc
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffload,
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecision,
    MixedPrecisionPolicy,
    ShardingStrategy,
    fully_shard,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

STEPS = 3
LR = 0.1

# this process's place in the job, set by main()
rank, world_size, device = 0, 1, torch.device("hpu")


class MLP(nn.Module):
    """``w1`` and ``w2`` are the column- and row-parallel pair of tensor parallelism; every size splits evenly in 2."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(8, 16)
        self.w2 = nn.Linear(16, 8)
        self.out = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.w2(torch.relu(self.w1(x)))))


def mlp() -> MLP:
    torch.manual_seed(0)
    return MLP()


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """``STEPS`` steps of SGD on the mean squared error over the rows ``x``, ``y``."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(STEPS):
        optimizer.zero_grad()
        # the loss in the rows' dtype: up to torch 2.11 at least, mse_loss of a bf16 output (mixed precision) and fp32
        # targets computes in fp32 but fails in backward (pytorch#36553)
        nn.functional.mse_loss(model(x.to(device)).to(y.dtype), y.to(device)).backward()
        optimizer.step()


def full_weights(model: nn.Module) -> dict:
    """The unsharded fp32 parameters, by name, as nested lists."""
    if isinstance(model, FSDP):
        with FSDP.summon_full_params(model):
            return {name: p.detach().float().cpu().tolist() for name, p in model.named_parameters()}
    full = {}
    for name, p in model.named_parameters():
        if isinstance(p, DTensor):
            # shards offloaded to the host are gathered on the device: HCCL, as NCCL, has no CPU collectives
            p = DTensor.from_local(p.to_local().to(device), p.device_mesh, p.placements).full_tensor()
        full[name] = p.detach().float().cpu().tolist()
    return full


def local_elements(model: nn.Module) -> int:
    """How many parameter elements this rank holds."""
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters())


def force_sum(model: nn.Module) -> None:
    """HCCL has no AVG: FSDP2 then sums and divides (each FSDP module keeps its own setting)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)


def fully_shard_mlp(model: nn.Module, mesh, **kwargs) -> nn.Module:
    for layer in (model.w1, model.w2, model.out):
        fully_shard(layer, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    return model


def attempt(fn, *args, **kwargs) -> object:
    """``fn(*args, **kwargs)``, or the error it raised as ``"Type: message"`` (for the test to report or expect)."""
    try:
        return fn(*args, **kwargs)
    except Exception as error:
        return f"{type(error).__name__}: {error}"


def training(x: torch.Tensor, y: torch.Tensor) -> dict:
    results = {}
    rows = x.chunk(world_size)[rank], y.chunk(world_size)[rank]

    def fsdp1(strategy: str, mesh_shape=None, **kwargs) -> dict:
        mesh = init_device_mesh("hpu", mesh_shape, mesh_dim_names=("replicate", "shard")) if mesh_shape else None
        module = mlp() if "cpu_offload" in kwargs else mlp().to(device)
        model = FSDP(
            module,
            device_id=device,
            use_orig_params=True,
            sharding_strategy=ShardingStrategy[strategy],
            auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
            device_mesh=mesh,
            **kwargs,
        )
        train(model, *rows)
        return {"local": local_elements(model), "weights": full_weights(model)}

    results["fsdp1_FULL_SHARD"] = attempt(fsdp1, "FULL_SHARD")
    results["fsdp1_SHARD_GRAD_OP"] = attempt(fsdp1, "SHARD_GRAD_OP")
    results["fsdp1_NO_SHARD"] = attempt(fsdp1, "NO_SHARD")
    results["fsdp1_HYBRID_SHARD"] = attempt(fsdp1, "HYBRID_SHARD", mesh_shape=(1, 2))
    results["fsdp1_cpu_offload"] = attempt(fsdp1, "FULL_SHARD", cpu_offload=CPUOffload(offload_params=True))
    bf16 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)
    results["fsdp1_bf16"] = attempt(fsdp1, "FULL_SHARD", mixed_precision=bf16)

    def fsdp2(mesh_shape=(world_size,), **kwargs) -> dict:
        names = ("replicate", "shard") if len(mesh_shape) == 2 else None
        mesh = init_device_mesh("hpu", mesh_shape, mesh_dim_names=names)
        model = fully_shard_mlp(mlp() if "offload_policy" in kwargs else mlp().to(device), mesh, **kwargs)
        force_sum(model)
        train(model, *rows)
        devices = sorted({str(p.to_local().device) for p in model.parameters()})
        return {"local": local_elements(model), "weights": full_weights(model), "devices": devices}

    results["fsdp2"] = attempt(fsdp2)
    results["fsdp2_cpu_offload"] = attempt(fsdp2, offload_policy=CPUOffloadPolicy(pin_memory=True))
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    results["fsdp2_bf16"] = attempt(fsdp2, mp_policy=bf16)
    results["fsdp2_hsdp"] = attempt(fsdp2, (world_size, 1))

    def fsdp2_without_force_sum() -> None:
        model = fully_shard_mlp(mlp().to(device), init_device_mesh("hpu", (world_size,)))
        train(model, *rows)

    results["fsdp2_avg"] = attempt(fsdp2_without_force_sum)

    def tensor_parallel(mesh_shape) -> dict:
        """TP over "tp"; with a ("dp", "tp") mesh, FSDP2 over "dp", each data-parallel rank on its own rows."""
        model = mlp().to(device)
        if mesh_shape is None:
            tp_mesh, dp_mesh = init_device_mesh("hpu", (world_size,), mesh_dim_names=("tp",)), None
        else:
            mesh2d = init_device_mesh("hpu", mesh_shape, mesh_dim_names=("dp", "tp"))
            tp_mesh, dp_mesh = mesh2d["tp"], mesh2d["dp"]
        parallelize_module(model, tp_mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        dp_rank, dp_size = 0, 1
        if dp_mesh is not None:
            fully_shard(model, mesh=dp_mesh)
            force_sum(model)
            dp_rank, dp_size = dp_mesh.get_local_rank(), dp_mesh.size()
        train(model, x.chunk(dp_size)[dp_rank], y.chunk(dp_size)[dp_rank])
        placements = {name: str(p.placements) for name, p in model.named_parameters() if isinstance(p, DTensor)}
        return {"local": local_elements(model), "weights": full_weights(model), "placements": placements}

    def dtensor_ops() -> dict:
        from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

        mesh = init_device_mesh("hpu", (world_size,))
        full = torch.arange(32.0).reshape(8, 4)
        sharded = distribute_tensor(full.to(device), mesh, [Shard(1)])
        partial = DTensor.from_local(torch.full((4, 2), rank + 1.0, device=device), mesh, [Partial()])
        return {
            "local": [str(sharded.to_local().device), list(sharded.to_local().shape)],
            "full_tensor": torch.equal(sharded.full_tensor().cpu(), full),
            "to_shard_0": torch.equal(sharded.redistribute(mesh, [Shard(0)]).to_local().cpu(), full.chunk(2)[rank]),
            "to_replicate": torch.equal(sharded.redistribute(mesh, [Replicate()]).to_local().cpu(), full),
            "partial_to_shard": partial.redistribute(mesh, [Shard(0)]).to_local().tolist(),  # a reduce-scatter
            "sum": sharded.sum().full_tensor().item(),
            "mean": attempt(lambda: sharded.mean().full_tensor().item()),
        }

    results["dtensor"] = attempt(dtensor_ops)
    results["tp"] = attempt(tensor_parallel, None)
    results["dp1_tp2"] = attempt(tensor_parallel, (1, world_size))
    results["dp2_tp1"] = attempt(tensor_parallel, (world_size, 1))
    return results


def memory() -> dict:
    """Peak device memory (``MaxInUse`` above what was in use before) of building and training a stack of layers
    with Adam, unsharded and sharded; ``parameter_bytes`` is the size of the full parameters."""
    import habana_frameworks.torch.hpu as hthpu

    layers, width = 8, 256

    def stack() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])

    def peak(build) -> int:
        gc.collect()
        hthpu.reset_peak_memory_stats()
        before = hthpu.memory_stats()["InUse"]
        model = build()
        x = torch.randn(8, width, device=device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(STEPS):
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
        return hthpu.memory_stats()["MaxInUse"] - before

    def fsdp1(strategy: str) -> nn.Module:
        return FSDP(
            stack(),
            device_id=device,
            use_orig_params=True,
            sharding_strategy=ShardingStrategy[strategy],
            auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
        )

    def fsdp2() -> nn.Module:
        model = stack().to(device)
        mesh = init_device_mesh("hpu", (world_size,))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        force_sum(model)
        return model

    return {
        "parameter_bytes": layers * (width * width + width) * 4,
        "NO_SHARD": peak(lambda: fsdp1("NO_SHARD")),
        "FULL_SHARD": peak(lambda: fsdp1("FULL_SHARD")),
        "fully_shard": peak(fsdp2),
    }


def checkpoint(x: torch.Tensor, y: torch.Tensor, work_dir: str) -> dict:
    """Save model and Adam state sharded, load them into a model initialised differently, train one more step each."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    rows = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
    mesh = init_device_mesh("hpu", (world_size,))

    def step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(rows[0].to(device)), rows[1].to(device)).backward()
        optimizer.step()

    def round_trip(build, name: str) -> dict:
        model = build(0)
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        for _ in range(STEPS):
            step(model, optimizer)
        model_state, optimizer_state = get_state_dict(model, optimizer)
        saved = sorted(
            {
                f"{type(v).__name__} {(v.to_local() if isinstance(v, DTensor) else v).device}"
                for v in model_state.values()
            }
        )
        path = os.path.join(work_dir, name)
        dcp.save({"model": model_state, "optim": optimizer_state}, checkpoint_id=path)
        # a different initialisation, and Adam state that exists only once loaded
        restored = build(1)
        restored_optimizer = torch.optim.Adam(restored.parameters(), lr=LR)
        model_state, optimizer_state = get_state_dict(restored, restored_optimizer)
        state = {"model": model_state, "optim": optimizer_state}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(restored, restored_optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        loaded = full_weights(restored) == full_weights(model)
        step(model, optimizer)
        step(restored, restored_optimizer)
        return {
            "saved": saved,
            "files": sorted(os.listdir(path)),
            "loaded_equal": loaded,
            "next_step_equal": full_weights(restored) == full_weights(model),
        }

    def fsdp2(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        model = fully_shard_mlp(MLP().to(device), mesh)
        force_sum(model)
        return model

    def fsdp1(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return FSDP(MLP().to(device), device_id=device, use_orig_params=True)

    return {"fsdp2": round_trip(fsdp2, "fsdp2"), "fsdp1": round_trip(fsdp1, "fsdp1")}


def main() -> None:
    global rank, world_size, device
    import virtual_hpu
    from virtual_hpu import torch_support

    assert virtual_hpu.activate_from_env()
    import habana_frameworks.torch.distributed.hccl  # noqa: F401  (registers "hccl")

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("hpu", int(os.environ["LOCAL_RANK"]))
    torch.hpu.set_device(device)
    batch_file, work_dir = sys.argv[1:3]
    batch = torch.load(batch_file)
    dist.init_process_group("hccl", device_id=torch_support.hpu_group_device(device), timeout=timedelta(seconds=60))
    results = {
        "training": training(batch["x"], batch["y"]),
        "memory": attempt(memory),
        "checkpoint": attempt(checkpoint, batch["x"], batch["y"], work_dir),
    }
    # models go before their groups: see the teardown note in test_distributed.py
    gc.collect()
    dist.destroy_process_group()
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
