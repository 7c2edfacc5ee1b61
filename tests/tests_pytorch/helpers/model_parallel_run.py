"""Fit ``ddp_run.py``'s data with FSDP2 and tensor parallelism (``strategy="model_parallel"``) and save rank 0's full
weights and each rank's local parameter count, for equivalence tests against one process on the whole batches.

``--tensor-parallel N``: the MLP's first layer is split by columns and its second by rows over N HPUs; the remaining
data-parallel dimension is sharded with ``fully_shard``.
"""

import os
from argparse import ArgumentParser

import torch

# run as a script, beside ddp_run.py
from ddp_run import GLOBAL_BATCH, RankSlices, Regression
from torch.utils.data import DataLoader

import pytorch_lightning as pl


class ParallelRegression(Regression):
    """``ddp_run.py``'s regression model, parallelized in ``configure_model`` on ``self.device_mesh``."""

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = self.device_mesh
        if mesh["tensor_parallel"].size() > 1:
            parallelize_module(self.net, mesh["tensor_parallel"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        if mesh["data_parallel"].size() > 1:
            fully_shard(self.net, mesh=mesh["data_parallel"])

    def train_dataloader(self) -> DataLoader:
        # tensor-parallel ranks see the same rows; data-parallel ranks their own
        mesh = self.device_mesh["data_parallel"]
        return DataLoader(
            RankSlices(mesh.get_local_rank(), mesh.size(), self.outputs), batch_size=GLOBAL_BATCH // mesh.size()
        )


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--tensor-parallel", type=int, default=1)
    parser.add_argument("--outputs", type=int, default=2)
    parser.add_argument("--max-epochs", type=int, default=1)
    parser.add_argument("--checkpoint", help="save a distributed checkpoint here at the end of fit")
    parser.add_argument("--resume", help="fit(ckpt_path=...) from this checkpoint")
    args = parser.parse_args()
    from lightning.pytorch.strategies import ModelParallelStrategy

    model = ParallelRegression(args.outputs)
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=2,
        strategy=ModelParallelStrategy(
            data_parallel_size=2 // args.tensor_parallel, tensor_parallel_size=args.tensor_parallel
        ),
        max_epochs=args.max_epochs,
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, ckpt_path=args.resume)
    if args.checkpoint:
        trainer.save_checkpoint(args.checkpoint)
    from torch.distributed.tensor import DTensor

    full = {
        name: (value.full_tensor() if isinstance(value, DTensor) else value).detach().float().cpu()
        for name, value in model.state_dict().items()
    }
    local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters())
    torch.save(
        {
            "state": full,
            "local_numel": local,
            "strategy": type(trainer.strategy).__name__,
            "devices": {str(p.device) for p in model.parameters()},
            "dtensor": all(isinstance(p, DTensor) for p in model.parameters()),
            "global_step": trainer.global_step,
            "lr": trainer.optimizers[0].param_groups[0]["lr"],
        },
        os.path.join(args.out, f"rank{trainer.global_rank}.pt"),
    )


if __name__ == "__main__":
    main()
