"""Train a small network with Lightning Fabric, importing only ``lightning`` (as a Fabric user's script does), and
save what each rank ends with.

Each data-parallel rank trains on its own rows of a fixed batch (rank ``r`` of ``w`` takes rows ``r::w``), so a run on
``w`` ranks steps exactly like one process on the union of the rows; the ranks of a tensor-parallel group share theirs.
Started directly it launches its ranks with ``fabric.launch()``; started by ``torchrun`` it is one of them. Each rank
saves ``rank<N>.pt`` in ``--out``: the final parameters, the losses, the step count (``--resume`` continues from a
checkpoint ``--checkpoint`` saved), the classes Fabric chose, the options of its DDP module, and the virtual Gaudi's
counter increments per steady step.
"""

import os
import sys
from argparse import ArgumentParser
from contextlib import nullcontext
from typing import Optional

import lightning as L
import torch
from lightning.fabric.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.tensor import DTensor, Replicate

ROWS = 16


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 3))


def fully_sharded(network: nn.Module, mesh) -> nn.Module:
    """FSDP2 over the mesh's data-parallel ranks, each linear layer a unit, as ``ModelParallelStrategy`` users write."""
    from torch.distributed.fsdp import fully_shard

    for layer in network:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh["data_parallel"])
    return fully_shard(network, mesh=mesh["data_parallel"])


def tensor_parallel(network: nn.Module, mesh) -> nn.Module:
    """The first linear layer split by columns, the last by rows, over the mesh's tensor-parallel ranks; the norm
    between them sees whole rows."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {"0": ColwiseParallel(output_layouts=Replicate()), "3": RowwiseParallel(input_layouts=Replicate())}
    # the strategy moves no module: the layers left whole go to the rank's device here
    return parallelize_module(network, mesh["tensor_parallel"], plan).to(mesh.device_type)


# Fabric's strategies that take a function, by the names this script accepts
MODEL_PARALLEL = {
    "model_parallel_fsdp2": lambda devices: ModelParallelStrategy(fully_sharded, devices, 1),
    "model_parallel_tp": lambda devices: ModelParallelStrategy(tensor_parallel, 1, devices),
}


def counters() -> dict:
    virtual_hpu = sys.modules.get("virtual_hpu")
    if virtual_hpu is None or not virtual_hpu.is_active():
        return {}
    from virtual_hpu import accounting

    return accounting.counters()


def train(fabric: L.Fabric, args) -> None:
    fabric.seed_everything(7)
    network = model()
    if args.strategy in MODEL_PARALLEL:  # the module's parameters are replaced: the optimizer comes after
        network = fabric.setup(network)
        optimizer = fabric.setup_optimizers(torch.optim.AdamW(network.parameters(), lr=0.05))
    else:
        network, optimizer = fabric.setup(network, torch.optim.AdamW(network.parameters(), lr=0.05))
    generator = torch.Generator().manual_seed(3)
    inputs, targets = torch.randn(ROWS, 6, generator=generator), torch.randint(0, 3, (ROWS,), generator=generator)
    state = {"model": network, "optimizer": optimizer, "step": 0}
    if args.resume:
        fabric.load(args.resume, state)
    replicas = getattr(fabric.strategy, "distributed_sampler_kwargs", None) or {"num_replicas": 1, "rank": 0}
    rows = slice(replicas["rank"], None, replicas["num_replicas"])
    inputs, targets = fabric.to_device((inputs[rows], targets[rows]))
    losses, snapshots = [], []
    for _ in range(args.steps):
        snapshots.append(counters())
        loss = nn.functional.cross_entropy(network(inputs).float(), targets)
        fabric.backward(loss)
        if args.clip:
            fabric.clip_gradients(network, optimizer, max_norm=args.clip)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    state["step"] += args.steps
    if args.checkpoint:
        fabric.save(args.checkpoint, state)
    parameters = full_parameters(network)
    record = {
        "parameters": parameters,
        "losses": [float(loss) for loss in losses],
        "step": state["step"],
        "mean_loss": float(fabric.all_reduce(losses[-1].float(), reduce_op="mean")),
        "gathered_rank": fabric.all_gather(torch.tensor([fabric.global_rank], device=fabric.device)).cpu().tolist(),
        "broadcast": fabric.broadcast(fabric.global_rank * 10 + 5, src=0),
        "classes": {
            "accelerator": type(fabric.accelerator).__name__,
            "strategy": type(fabric.strategy).__name__,
            "precision": type(fabric._precision).__name__,
            "device": str(fabric.device),
            "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        },
        "per_step": per_step(snapshots),
        "ddp_options": ddp_options(network),
    }
    fabric.barrier()
    torch.save(record, os.path.join(args.out, f"rank{fabric.global_rank}.pt"))


def full_parameters(network: nn.Module) -> dict:
    """The whole parameters, by their names in the model as written, gathered first under FSDP."""
    sharded = [module for module in network.modules() if isinstance(module, FullyShardedDataParallel)]
    with FullyShardedDataParallel.summon_full_params(sharded[0]) if sharded else nullcontext():
        return {
            name: (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().float().cpu().clone()
            for name, tensor in network.module.named_parameters()
        }


def ddp_options(network: nn.Module) -> Optional[list]:
    """``[bucket_bytes_cap, gradient_as_bucket_view]`` of the ``DistributedDataParallel`` Fabric wrapped the model in,
    if it did."""
    wrapped = [module for module in network.modules() if isinstance(module, nn.parallel.DistributedDataParallel)]
    return [wrapped[0].bucket_bytes_cap, wrapped[0].gradient_as_bucket_view] if wrapped else None


def per_step(snapshots: list, warmup: int = 2) -> dict:
    """Counter increments between consecutive steps after ``warmup`` steps, as sets of distinct values."""
    steady = [snapshot for snapshot in snapshots[warmup:] if snapshot]
    return {
        key: sorted({later[key] - earlier[key] for earlier, later in zip(steady, steady[1:])})
        for key in ("mark_steps", "host_syncs", "graphs", "all_reduces", "collective_bytes")
    }


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("--out", required=True, help="a folder, created if missing")
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--devices", default="1")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--clip", type=float, default=0.0)
    parser.add_argument("--checkpoint", default=None, help="save model, optimizer and step count here at the end")
    parser.add_argument("--resume", default=None, help="load them from here before training")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    devices = int(args.devices) if args.devices.lstrip("-").isdigit() else args.devices
    strategy = MODEL_PARALLEL[args.strategy](devices) if args.strategy in MODEL_PARALLEL else args.strategy
    fabric = L.Fabric(accelerator=args.accelerator, devices=devices, strategy=strategy, precision=args.precision)
    fabric.launch(train, args)


if __name__ == "__main__":
    main()
