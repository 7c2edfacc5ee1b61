"""Run several Trainer stages in one process (``--stages fit,fit,test,predict`` by default) with a multi-process HPU
strategy, the way user code does: a DataModule and a LightningModule that both override ``prepare_data``, and a
LightningModule that makes a gloo process group of its own in ``setup`` and all-reduces a CPU tensor over it. Each
``fit`` trains a new model (FSDP leaves a fitted module sharded), which the next stages use. Each rank saves what it
saw to ``rank<N>.pt``.

``--plain``: neither ``prepare_data`` nor a group of the user's (Lightning then makes no group of its own either), and
rank 0 alone makes a one-rank group at the end of the first ``fit``, as a library writing files from rank 0 may: the
ranks' counts of groups made then differ, and any group made collectively later would never form.
A rank still running after ``--hang-after`` seconds prints where every thread is and exits with
1 (a hang fails the run instead of blocking it).
"""

import faulthandler
import os
from argparse import ArgumentParser

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pytorch_lightning as pl

# what the hooks saw, over all stages: prepare_data calls of the DataModule and of the LightningModules, and the sum of
# ``rank + 1`` over each gloo group
SEEN: dict = {"prepared": [0, 0], "gloo_sums": []}


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(16, 8, generator=torch.Generator().manual_seed(0))), batch_size=2)


class PlainData(pl.LightningDataModule):
    def train_dataloader(self) -> DataLoader:
        return _loader()

    def test_dataloader(self) -> DataLoader:
        return _loader()

    def predict_dataloader(self) -> DataLoader:
        return _loader()


class Data(PlainData):
    def prepare_data(self) -> None:
        SEEN["prepared"][0] += 1


class PlainModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))

    def configure_model(self) -> None:
        mesh = getattr(self, "_device_mesh", None)
        if mesh is not None and not hasattr(self, "_sharded"):
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.net, mesh=mesh["data_parallel"])
            self._sharded = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        return self(batch[0]).pow(2).mean()

    def test_step(self, batch, batch_idx) -> None:
        self.log("test_loss", self(batch[0]).pow(2).mean(), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Model(PlainModel):
    def prepare_data(self) -> None:
        SEEN["prepared"][1] += 1

    def setup(self, stage: str) -> None:
        # what libraries and user code do for host-side exchanges, next to the HCCL group
        group = dist.new_group(backend="gloo")
        total = torch.tensor([self.global_rank + 1.0])
        dist.all_reduce(total, group=group)
        SEEN["gloo_sums"].append(total.item())
        dist.destroy_process_group(group)


class RankZeroGroupModel(PlainModel):
    def on_train_end(self) -> None:
        if self.global_rank == 0:
            dist.new_group([0], backend="gloo")


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--stages", default="fit,fit,test,predict")
    parser.add_argument("--sharding", help="with --strategy hpu_fsdp: its sharding_strategy, without a device mesh")
    parser.add_argument("--plain", action="store_true")
    parser.add_argument("--hang-after", type=float, default=200)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.hang_after, exit=True)

    data = PlainData() if args.plain else Data()
    strategy = args.strategy
    if args.sharding:
        from pytorch_lightning.strategies import HPUFSDPStrategy

        strategy = HPUFSDPStrategy(sharding_strategy=args.sharding, auto_wrap_policy={nn.Linear})
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=args.devices,
        strategy=strategy,
        max_epochs=1,
        limit_train_batches=2,
        limit_test_batches=2,
        limit_predict_batches=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    done, predictions = [], None
    for stage in args.stages.split(","):
        if stage == "fit":
            model = (RankZeroGroupModel if args.plain and not done else PlainModel if args.plain else Model)()
            # one more epoch at each fit: the second trains as well
            trainer.fit_loop.max_epochs = trainer.current_epoch + 1
        output = getattr(trainer, stage)(model, datamodule=data)
        if stage == "predict":
            predictions = len(output)
        done.append(stage)
    faulthandler.cancel_dump_traceback_later()
    mesh = getattr(trainer.strategy, "kwargs", {}).get("device_mesh")
    torch.save(
        {
            "stages": done,
            "global_step": trainer.global_step,
            **SEEN,
            "predictions": predictions,
            "strategy": type(trainer.strategy).__name__,
            "mesh": None if mesh is None else tuple(mesh.shape),
        },
        os.path.join(args.out, f"rank{trainer.global_rank}.pt"),
    )


if __name__ == "__main__":
    main()
