"""Fabric programs in the shape users write for several devices, importing only ``lightning``, for
``tests_pytorch/multi_device``.

Started directly, ``fabric.launch()`` starts the other rank. Each rank saves what it observed in ``<out>/rank<N>.pt``.

Scenarios (``--scenario``):

- ``collectives``: barrier, ``broadcast``, ``all_gather`` and ``all_reduce`` of tensors and collections; gradient
  accumulation with ``no_backward_sync`` over a distributed loader, against one process on the CPU; ``save`` on rank 0
  and ``load`` on every rank.
- ``rank_zero_first``: data prepared once, by rank 0, while the other rank waits.
"""

import os
from argparse import ArgumentParser
from pathlib import Path

import lightning as L
import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn
from torch.utils.data import DataLoader

ROWS, FEATURES, ACCUMULATE = 16, 6, 2


def rows() -> list:
    """A fixed regression data set whose items carry their index."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(ROWS, FEATURES, generator=generator)
    y = x.sum(dim=1, keepdim=True).sin()
    return list(zip(range(ROWS), x, y))


def network() -> nn.Module:
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))


def optimizer_of(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def host(value):
    """Tensors (also in dicts and lists) on the host, to be saved and compared with another run."""
    return apply_to_collection(value, torch.Tensor, lambda tensor: tensor.detach().cpu().clone())


def one_process_on_the_cpu(world_size: int, batch_size: int) -> dict:
    """What ``collectives`` trains, in one process on whole global batches: each step is the mean loss over the rows
    that all ranks took in their accumulated micro-batches."""
    model = network()
    optimizer = optimizer_of(model)
    global_batch = world_size * batch_size * ACCUMULATE
    for start in range(0, ROWS, global_batch):
        _, x, y = zip(*rows()[start : start + global_batch])
        nn.functional.mse_loss(model(torch.stack(x)), torch.stack(y)).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.state_dict()


def gradients(model: nn.Module) -> torch.Tensor:
    return torch.cat([parameter.grad.flatten() for parameter in model.parameters()])


def collectives(fabric: L.Fabric, out: Path) -> dict:
    rank, device = fabric.global_rank, fabric.device
    fabric.barrier()
    result = host(
        {
            "device": str(device),
            "broadcast_object": fabric.broadcast({"from": rank, "items": [rank] * 2}),
            "broadcast_tensor": fabric.broadcast(torch.tensor([rank + 5.0], device=device)),
            "all_gather": fabric.all_gather(torch.tensor([rank, 10 + rank], device=device)),
            "all_gather_dict": fabric.all_gather(
                {"a": torch.tensor(rank, device=device), "b": [torch.ones(2, device=device)]}
            ),
            "all_reduce": {
                f"{op} {str(dtype)[6:]}": fabric.all_reduce(
                    torch.tensor(rank + 1, dtype=dtype, device=device), reduce_op=op
                )
                for op in ("sum", "max", "min")
                for dtype in (torch.int32, torch.int64, torch.float32, torch.float16, torch.bfloat16)
            }
            | {
                f"mean {str(dtype)[6:]}": fabric.all_reduce(torch.tensor(rank + 1, dtype=dtype, device=device))
                for dtype in (torch.float32, torch.bfloat16)
            },
            "all_reduce_dict": fabric.all_reduce({"x": torch.full((2,), rank + 1.0, device=device)}, reduce_op="sum"),
        }
    )

    model = network()
    model, optimizer = fabric.setup(model, optimizer_of(model))
    loader = fabric.setup_dataloaders(DataLoader(rows(), batch_size=2))
    # per micro-batch: whether the optimizer steps after it, and whether the ranks' gradients are then equal
    seen, synchronised = [], []
    for micro_batch, (index, x, y) in enumerate(loader):
        seen += index.tolist()
        stepping = micro_batch % ACCUMULATE == ACCUMULATE - 1
        with fabric.no_backward_sync(model, enabled=not stepping):
            fabric.backward(nn.functional.mse_loss(model(x), y) / ACCUMULATE)
        both = fabric.all_gather(gradients(model))
        synchronised.append((stepping, bool(torch.equal(both[0], both[1]))))
        if stepping:
            optimizer.step()
            optimizer.zero_grad()
    result |= {
        "seen": seen,
        "synchronised": synchronised,
        "weights": host(model.state_dict()),
        "reference": one_process_on_the_cpu(fabric.world_size, 2),
    }

    checkpoint = out / "checkpoint.ckpt"
    fabric.save(checkpoint, {"model": model, "optimizer": optimizer, "step": len(seen)})
    loaded_model = network()
    loaded_model, loaded_optimizer = fabric.setup(loaded_model, optimizer_of(loaded_model))
    state = {"model": loaded_model, "optimizer": loaded_optimizer, "step": 0}
    fabric.load(checkpoint, state)
    result["loaded"] = {
        "step": state["step"],
        "weights": host(loaded_model.state_dict()),
        "optimizer": host(loaded_optimizer.state_dict()["state"]),
        "saved_optimizer": host(optimizer.state_dict()["state"]),
    }
    return result


def rank_zero_first(fabric: L.Fabric, out: Path) -> dict:
    prepared = out / "prepared.pt"
    with fabric.rank_zero_first():
        if not prepared.exists():
            torch.save(rows(), prepared)
            with open(out / "preparations.txt", "a") as file:
                file.write(f"rank {fabric.global_rank}\n")
        data = torch.load(prepared)
    return {"rows": len(data)}


SCENARIOS = {function.__name__: function for function in (collectives, rank_zero_first)}


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    parser.add_argument("--accelerator", default="hpu", choices=("hpu", "cpu"))
    args = parser.parse_args()
    fabric = L.Fabric(accelerator=args.accelerator, devices=2, strategy="ddp")
    fabric.launch()
    result = SCENARIOS[args.scenario](fabric, Path(args.out))
    torch.save(result, os.path.join(args.out, f"rank{fabric.global_rank}.pt"))


if __name__ == "__main__":
    main()
