"""Fit a small linear model with plain SGD and save each rank's final parameters, for data-parallel equivalence tests.

Every rank trains on its own slice of a fixed data set (rank ``r`` gets rows ``r::world_size`` of each global
batch), so a 1-process run on whole global batches must end with the same parameters as an N-process run.
"""

import os
from argparse import ArgumentParser

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import pytorch_lightning as pl

GLOBAL_BATCH, STEPS, FEATURES = 8, 4, 16


def global_batches() -> list:
    generator = torch.Generator().manual_seed(7)
    return [
        (torch.randn(GLOBAL_BATCH, FEATURES, generator=generator), torch.randn(GLOBAL_BATCH, 1, generator=generator))
        for _ in range(STEPS)
    ]


class RankSlices(Dataset):
    """Yields, per step, this rank's rows of the global batch."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.batches = [(x[rank::world_size], y[rank::world_size]) for x, y in global_batches()]

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int):
        return self.batches[index]


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def train_dataloader(self) -> DataLoader:
        world_size, rank = self.trainer.world_size, self.trainer.global_rank
        return DataLoader(RankSlices(rank, world_size), batch_size=None)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--compile", action="store_true", help="fit torch.compile(model, backend='hpu_backend')")
    args = parser.parse_args()
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy=args.strategy,
        max_epochs=1,
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Regression()
    trainer.fit(torch.compile(model, backend="hpu_backend") if args.compile else model)
    # importable once the (virtual) Gaudi is loaded, which importing pytorch_lightning does in lazy mode
    from habana_frameworks.torch.hpu.metrics import metric_global

    state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    torch.save(
        {
            "state": state,
            "world_size": trainer.world_size,
            "strategy": type(trainer.strategy).__name__,
            "loss": float(trainer.callback_metrics["loss"]),
            "compilations": dict(metric_global("graph_compilation").stats())["TotalNumber"],
        },
        os.path.join(args.out, f"rank{trainer.global_rank}.pt"),
    )


if __name__ == "__main__":
    main()
