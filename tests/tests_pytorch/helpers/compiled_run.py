"""Train a small network compiled with ``torch.compile`` as a CUDA script writes it, with Lightning Fabric or the
Trainer; each rank saves its losses per case.

One launched run trains every combination of ``--strategies`` and ``--compile`` in turn, in the same processes (the
first Fabric or Trainer launches them; the later ones join its process group). ``--compile`` is ``none`` (eager),
``default`` (``torch.compile(model)``) or a backend name passed as ``backend=``. The Trainer's ``fsdp2`` is
``HPUModelParallelStrategy`` with ``fully_shard``. Each rank trains on its own rows of a fixed batch, so runs with and
without compilation see the same data and should give the same losses.
"""

import os
from argparse import ArgumentParser

import lightning as L
import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

import pytorch_lightning as pl
from pytorch_lightning.strategies import HPUModelParallelStrategy

ROWS = 16
STEPS = 4


class Block(nn.Module):
    """A model's own block class, as real models have (dynamo skips the frames of torch's own modules, such as
    ``nn.Sequential``, when they carry hooks as FSDP2's do, so a compiled ``Sequential`` under FSDP2 captures nothing,
    on any device)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(6, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = Block()
        self.losses: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        loss = nn.functional.cross_entropy(self(inputs).float(), targets)
        self.log("loss", loss)
        return loss

    def on_train_batch_end(self, outputs: dict, batch: tuple, batch_idx: int) -> None:
        self.losses.append(float(outputs["loss"].detach()))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class ShardedNet(Net):
    """For the Trainer's model-parallel strategy: FSDP2 applied in ``configure_model``, then compiled there, as
    upstream's documentation has it (the Trainer refuses a compiled module with this strategy)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def configure_model(self) -> None:
        fully_shard(self.net, mesh=self.device_mesh["data_parallel"])
        self.net = compiled(self.net, self.how)


def data(rank: int, world_size: int) -> tuple:
    generator = torch.Generator().manual_seed(3)
    inputs, targets = torch.randn(ROWS, 6, generator=generator), torch.randint(0, 3, (ROWS,), generator=generator)
    return inputs[rank::world_size], targets[rank::world_size]


def compiled(module: nn.Module, how: str) -> nn.Module:
    if how == "none":
        return module
    return torch.compile(module) if how == "default" else torch.compile(module, backend=how)


def trainer_strategy(name: str) -> object:
    # FSDP2 over both devices (the default mesh would give them to tensor parallelism)
    return HPUModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1) if name == "fsdp2" else name


def fabric_losses(fabric: L.Fabric, how: str) -> list:
    fabric.seed_everything(7)
    module = compiled(Net(), how)
    if "deepspeed" in type(fabric.strategy).__name__.lower():
        # DeepSpeed sets the two up together
        module, optimizer = fabric.setup(module, torch.optim.SGD(module.parameters(), lr=0.1))
    else:
        module = fabric.setup_module(module)
        optimizer = fabric.setup_optimizers(torch.optim.SGD(module.parameters(), lr=0.1))
    inputs, targets = fabric.to_device(data(fabric.global_rank, fabric.world_size))
    losses = []
    for _ in range(STEPS):
        loss = nn.functional.cross_entropy(module(inputs).float(), targets)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def trainer_losses(trainer: L.Trainer, how: str, sharded_in_configure_model: bool = False) -> list:
    L.seed_everything(7)
    module = ShardedNet(how) if sharded_in_configure_model else Net()
    # the Trainer's distributed sampler gives rank r of w the rows r::w, as the Fabric loop takes them
    loader = torch.utils.data.DataLoader(list(zip(*data(0, 1))), batch_size=ROWS // trainer.world_size)
    trainer.fit(module if sharded_in_configure_model else compiled(module, how), loader)
    return module.losses


def _trainer(devices: int, strategy: str) -> L.Trainer:
    # the Trainer of ``pytorch_lightning``: the ``lightning`` package's resolves ``accelerator="hpu"`` elsewhere
    return pl.Trainer(
        accelerator="hpu",
        devices=devices,
        strategy=trainer_strategy(strategy),
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def _compilations() -> int:
    """Graphs dynamo captured so far (whether the backend compiled them anew or found them in its cache)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--loop", choices=("fabric", "trainer"), default="fabric")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--strategies", default="auto", help="comma-separated")
    parser.add_argument("--compile", default="none", help="comma-separated")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    losses, compilations, rank = {}, {}, 0
    for strategy in args.strategies.split(","):
        for how in args.compile.split(","):
            before = _compilations()
            if args.loop == "fabric":
                fabric = L.Fabric(accelerator="hpu", devices=args.devices, strategy=strategy)
                fabric.launch()
                losses[strategy, how], rank = fabric_losses(fabric, how), fabric.global_rank
            else:
                trainer = _trainer(args.devices, strategy)
                losses[strategy, how] = trainer_losses(trainer, how, sharded_in_configure_model=strategy == "fsdp2")
                rank = trainer.global_rank
            compilations[strategy, how] = _compilations() - before
            # after each case, so a failing one leaves those before it to compare
            torch.save({"losses": losses, "compilations": compilations}, os.path.join(args.out, f"rank{rank}.pt"))


if __name__ == "__main__":
    main()
