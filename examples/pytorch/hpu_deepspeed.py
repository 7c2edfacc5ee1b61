"""Train the demo's digit classifier with DeepSpeed ZeRO on Intel Gaudi (HPU): upstream DeepSpeed, bf16, 2 HPUs.

ZeRO stage 3 (the default here) partitions parameters, gradients and optimizer states across the processes; each HPU
holds only its share between layers. On a machine without Gaudi, run it on the virtual Gaudi::

    VIRTUAL_HPU=1 python examples/pytorch/hpu_deepspeed.py --devices 2 --stage 3

The same script written for CUDA would say ``strategy="deepspeed_stage_3"``: with ``accelerator="hpu"`` that name
selects the HPU strategy too.
"""

from argparse import ArgumentParser

from hpu_classifier import DigitsClassifier, DigitsDataModule

import pytorch_lightning as pl
from pytorch_lightning.strategies import HPUDeepSpeedStrategy


class ShardReport(pl.Callback):
    """Says, once training starts, the ZeRO stage and how many of the model's parameters this process holds."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        engine = trainer.strategy.deepspeed_engine
        # a ZeRO-3 parameter outside forward is an empty placeholder; its shard is `ds_tensor`, its full size `ds_numel`
        held = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in pl_module.parameters())
        total = sum(getattr(p, "ds_numel", p.numel()) for p in pl_module.parameters())
        print(
            f"rank {trainer.global_rank}: ZeRO stage {engine.zero_optimization_stage()}"
            f" ({type(engine.optimizer).__name__}), holds {held} of {total} parameters",
            flush=True,
        )


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--stage", type=int, choices=(1, 2, 3), default=3, help="the ZeRO stage")
    parser.add_argument("--precision", default="bf16-mixed", help="'bf16-mixed', '32-true' or '16-mixed'")
    parser.add_argument("--max-epochs", type=int, default=8)
    args = parser.parse_args()

    pl.seed_everything(42, workers=True)
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=args.devices,
        strategy=HPUDeepSpeedStrategy(stage=args.stage),
        precision=args.precision,
        max_epochs=args.max_epochs,
        callbacks=[ShardReport()],
        logger=False,
        enable_checkpointing=False,
    )
    model, data = DigitsClassifier(), DigitsDataModule()
    trainer.fit(model, datamodule=data)
    (metrics,) = trainer.test(model, datamodule=data, verbose=False)
    if trainer.is_global_zero:
        print(f"final metrics on {trainer.num_devices} x {trainer.accelerator.__class__.__name__}: ", end="")
        print(", ".join(f"{name}={value:.4f}" for name, value in sorted(metrics.items())))


if __name__ == "__main__":
    main()
