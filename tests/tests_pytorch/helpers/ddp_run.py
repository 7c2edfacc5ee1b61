"""Fit a small regression model with SGD (momentum, a per-step learning-rate schedule) and save each rank's final
parameters, for data-parallel equivalence tests of every HPU strategy, DeepSpeed's ZeRO stages included.

Every rank trains on its own slice of a fixed data set (rank ``r`` gets rows ``r::world_size`` of each global
batch), so a 1-process run on whole global batches must end with the same parameters as an N-process run. With
``--checkpoint`` the run saves a checkpoint at its end (a directory under DeepSpeed); ``--resume`` continues from one.
"""

import os
from argparse import ArgumentParser
from contextlib import nullcontext
from typing import Any, Optional

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

import pytorch_lightning as pl

GLOBAL_BATCH, STEPS, FEATURES = 8, 4, 16


def global_batches(outputs: int = 1) -> list:
    generator = torch.Generator().manual_seed(7)
    return [
        (
            torch.randn(GLOBAL_BATCH, FEATURES, generator=generator),
            torch.randn(GLOBAL_BATCH, outputs, generator=generator),
        )
        for _ in range(STEPS)
    ]


class RankSlices(Dataset):
    """This rank's rows of each global batch, in order: batches of ``GLOBAL_BATCH // world_size`` rows are its slices.

    A DataLoader with a batch size, not ``batch_size=None``: upstream's DeepSpeed strategy reads it for its config."""

    def __init__(self, rank: int, world_size: int, outputs: int = 1) -> None:
        batches = global_batches(outputs)
        self.rows = [(x, y) for xs, ys in batches for x, y in zip(xs[rank::world_size], ys[rank::world_size])]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int):
        return self.rows[index]


class Regression(pl.LightningModule):
    def __init__(self, outputs: int = 1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.outputs = outputs
        self.net = nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, outputs))
        self.rank_gain = False

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.rank_gain:  # inputs 4x larger on each next rank: the ranks' fp8 maxima fall in other powers of two
            x = x * 4**self.global_rank
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def train_dataloader(self) -> DataLoader:
        world_size, rank = self.trainer.world_size, self.trainer.global_rank
        return DataLoader(RankSlices(rank, world_size, self.outputs), batch_size=GLOBAL_BATCH // world_size)

    def configure_optimizers(self):
        # momentum and a schedule make a resumed run differ unless optimizer and scheduler states are restored
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.5)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.8)
        return [optimizer], [{"scheduler": scheduler, "interval": "step"}]


def host_state(trainer: pl.Trainer, model: pl.LightningModule, engine: Optional[Any]) -> dict:
    """The model's tensors on the host, gathered from every rank's partition first under ZeRO stage 3 and FSDP (on
    rank 0 only). An fp8 layer's scaling state (``_extra_state``) is not a tensor: it is saved on its own."""
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(trainer.strategy, FSDPStrategy):
        full = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
        with FSDP.state_dict_type(trainer.strategy.model, StateDictType.FULL_STATE_DICT, full):
            state = trainer.strategy.model.state_dict()
        return {name: tensor.detach().float().cpu().clone() for name, tensor in state.items()}
    gathered = nullcontext()
    if engine is not None and engine.zero_optimization_partition_weights():
        import deepspeed

        gathered = deepspeed.zero.GatheredParameters(list(model.parameters()))
    with gathered:
        tensors = {name: value for name, value in model.state_dict().items() if isinstance(value, Tensor)}
        return {name: tensor.detach().float().cpu().clone() for name, tensor in tensors.items()}


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--sharding", help="HPUFSDPStrategy(sharding_strategy=...) instead of --strategy")
    parser.add_argument("--state-dict", default="full", help="with --sharding: the checkpoint kind, full or sharded")
    parser.add_argument("--activation-checkpointing", action="store_true", help="with --sharding: of the Linear layers")
    parser.add_argument("--mesh", help="with --sharding: the device mesh as a shape, e.g. 1,2 (replicas, shards)")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--outputs", type=int, default=1, help="the number of regression targets")
    parser.add_argument("--compile", action="store_true", help="fit torch.compile(model, backend='hpu_backend')")
    parser.add_argument("--max-epochs", type=int, default=1)
    parser.add_argument("--checkpoint", help="save a checkpoint here at the end of fit")
    parser.add_argument("--resume", help="fit(ckpt_path=...) from this checkpoint")
    parser.add_argument(
        "--fp8",
        choices=("reduce", "local"),
        help="train the linear layers in fp8 (Transformer Engine), the ranks' inputs scaled apart, with the maxima"
        " reduced over the ranks or kept local",
    )
    args = parser.parse_args()
    model = Regression(args.outputs)
    plugins = []
    if args.fp8:
        from habana_frameworks.torch.hpex.experimental.transformer_engine import recipe

        from pytorch_lightning.plugins import HPUPrecisionPlugin

        plugins.append(HPUPrecisionPlugin("fp8"))
        scaling = recipe.DelayedScaling(reduce_amax=args.fp8 == "reduce")
        plugins[0].convert_modules(model, replace_layers=True, recipe=scaling)
        model.rank_gain = True
    strategy = args.strategy
    if args.sharding:
        from pytorch_lightning.strategies import HPUFSDPStrategy

        strategy = HPUFSDPStrategy(
            sharding_strategy=args.sharding,
            state_dict_type=args.state_dict,
            activation_checkpointing_policy={nn.Linear} if args.activation_checkpointing else None,
            **({"device_mesh": tuple(map(int, args.mesh.split(",")))} if args.mesh else {}),
        )
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy=strategy,
        precision=args.precision,
        max_epochs=args.max_epochs,
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        plugins=plugins,
    )
    trainer.fit(torch.compile(model, backend="hpu_backend") if args.compile else model, ckpt_path=args.resume)
    if args.checkpoint:
        trainer.save_checkpoint(args.checkpoint)
    # importable once the (virtual) Gaudi is loaded, which importing pytorch_lightning does in lazy mode
    from habana_frameworks.torch.hpu.metrics import metric_global

    engine = getattr(trainer.strategy, "deepspeed_engine", None)
    torch.save(
        {
            "state": host_state(trainer, model, engine),
            # the parameters this rank holds: its shard under ZeRO stage 3 and FSDP
            "local_numel": sum(parameter.numel() for parameter in trainer.strategy.model.parameters()),
            "zero_stage": engine.zero_optimization_stage() if engine is not None else None,
            "world_size": trainer.world_size,
            "strategy": type(trainer.strategy).__name__,
            "loss": float(trainer.callback_metrics["loss"]),
            "compilations": dict(metric_global("graph_compilation").stats())["TotalNumber"],
            "global_step": trainer.global_step,
            "lr": trainer.optimizers[0].param_groups[0]["lr"],
            # each fp8 layer's scaling state: scales and amax history (empty without --fp8)
            "fp8": {
                name: {key: value.cpu() for key, value in module.fp8_state.state_dict().items()}
                for name, module in model.named_modules()
                if hasattr(module, "fp8_state")
            },
        },
        os.path.join(args.out, f"rank{trainer.global_rank}.pt"),
    )


if __name__ == "__main__":
    main()
