"""A rank of a tensor-parallel fit on 2 HPUs whose model is created with ``init_module(empty_init=True)``: the
weights are materialized on the device mesh and initialized by DTensor's random ops, which ask the device module for
its "philox" random-number context. Prints the full initial and trained weights of rank 0 as JSON."""

import json

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.utils.data import DataLoader

import pytorch_lightning as pl


class TensorParallelMLP(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        self.initial = {}

    def configure_model(self) -> None:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        parallelize_module(
            self.net, self.device_mesh["tensor_parallel"], {"0": ColwiseParallel(), "2": RowwiseParallel()}
        )

    def on_fit_start(self) -> None:
        self.initial = _full_weights(self)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        data = [(torch.randn(8, generator=generator), torch.randn(2, generator=generator)) for _ in range(16)]
        return DataLoader(data, batch_size=4)


def _full_weights(module: torch.nn.Module) -> dict:
    return {name: p.full_tensor().detach().float().cpu().tolist() for name, p in module.named_parameters()}


def main() -> None:
    pl.seed_everything(7)
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2),
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with trainer.init_module(empty_init=True):
        model = TensorParallelMLP()
    trainer.fit(model)
    print(json.dumps({"initial": model.initial, "trained": _full_weights(model)}))


if __name__ == "__main__":
    main()
