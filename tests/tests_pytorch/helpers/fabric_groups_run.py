"""A Fabric training script's multi-process patterns on HPUs: ``fabric.rank_zero_first()`` around data preparation,
``fabric.barrier()``, a gloo group of the script's own, then a few steps of a model of two blocks. Each rank saves what
it saw to ``rank<N>.pt``.

``--strategy hpu_fsdp --sharding HYBRID_SHARD`` wraps each block (``auto_wrap_policy={Block}``), as LLM pretraining
scripts do, without a device mesh.
"""

import faulthandler
import os
from argparse import ArgumentParser

import lightning as L
import torch
import torch.distributed as dist
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--sharding", help="FSDP's sharding_strategy, blocks wrapped")
    parser.add_argument("--hang-after", type=float, default=200)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.hang_after, exit=True)

    strategy = args.strategy
    if args.sharding:
        from lightning_fabric.strategies import HPUFSDPStrategy

        strategy = HPUFSDPStrategy(auto_wrap_policy={Block}, sharding_strategy=args.sharding)
    fabric = L.Fabric(accelerator="hpu", devices=2, strategy=strategy)
    fabric.launch()

    prepared = []
    with fabric.rank_zero_first():
        prepared.append(fabric.global_rank)
    fabric.barrier()
    group = dist.new_group(backend="gloo")
    total = torch.tensor([fabric.global_rank + 1.0])
    dist.all_reduce(total, group=group)
    dist.destroy_process_group(group)

    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    losses = []
    for step in range(3):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step + 10 * fabric.global_rank))
        loss = model(x.to(fabric.device)).pow(2).mean()
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    fabric.barrier()
    faulthandler.cancel_dump_traceback_later()
    mesh = getattr(fabric.strategy, "_fsdp_kwargs", {}).get("device_mesh")
    torch.save(
        {
            "prepared": prepared,
            "gloo_sum": total.item(),
            "losses": losses,
            "strategy": type(fabric.strategy).__name__,
            "mesh": None if mesh is None else tuple(mesh.shape),
        },
        os.path.join(args.out, f"rank{fabric.global_rank}.pt"),
    )


if __name__ == "__main__":
    main()
