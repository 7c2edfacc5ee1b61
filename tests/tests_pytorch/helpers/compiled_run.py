"""Train a small network compiled with ``torch.compile`` as a CUDA script writes it, with Lightning Fabric or the
Trainer of the ``lightning`` package, importing only ``lightning``; each rank saves its losses.

``--compile`` is ``none`` (eager), ``default`` (``torch.compile(model)``) or a backend name passed as
``backend=``. Each rank trains on its own rows of a fixed batch, so runs with and without compilation see the same
data and should give the same losses.
"""

import os
from argparse import ArgumentParser

import lightning as L
import torch
from torch import nn

ROWS = 16
STEPS = 4


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 3))
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


def data(rank: int, world_size: int) -> tuple:
    generator = torch.Generator().manual_seed(3)
    inputs, targets = torch.randn(ROWS, 6, generator=generator), torch.randint(0, 3, (ROWS,), generator=generator)
    return inputs[rank::world_size], targets[rank::world_size]


def compiled(module: nn.Module, how: str) -> nn.Module:
    if how == "none":
        return module
    return torch.compile(module) if how == "default" else torch.compile(module, backend=how)


def fabric_losses(fabric: L.Fabric, how: str) -> list:
    fabric.seed_everything(7)
    module = compiled(Net(), how)
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


def trainer_losses(trainer: L.Trainer, how: str) -> list:
    L.seed_everything(7)
    module = Net()
    # the Trainer's distributed sampler gives rank r of w the rows r::w, as the Fabric loop takes them
    loader = torch.utils.data.DataLoader(list(zip(*data(0, 1))), batch_size=ROWS // trainer.world_size)
    trainer.fit(compiled(module, how), loader)
    return module.losses


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--loop", choices=("fabric", "trainer"), default="fabric")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--compile", default="none")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.loop == "fabric":
        fabric = L.Fabric(accelerator="hpu", devices=args.devices, strategy=args.strategy)
        fabric.launch()
        losses, rank = fabric_losses(fabric, args.compile), fabric.global_rank
    else:
        trainer = L.Trainer(
            accelerator="hpu",
            devices=args.devices,
            strategy=args.strategy,
            max_steps=STEPS,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        losses, rank = trainer_losses(trainer, args.compile), trainer.global_rank
    torch.save({"losses": losses}, os.path.join(args.out, f"rank{rank}.pt"))


if __name__ == "__main__":
    main()
