"""Fit ``ddp_run.py``'s regression model with an optimizer of Gaudi's ``hpex.optimizers`` returned from
``configure_optimizers`` (or with its ``torch.optim`` counterpart) and save each rank's results. ``--checkpoint``
saves a checkpoint at the end of fit, ``--resume`` continues from one."""

import os
from argparse import ArgumentParser

import torch
from ddp_run import Regression

import pytorch_lightning as pl


def configure(name: str, parameters) -> dict:
    """The optimizer (with a per-step schedule for the SGD ones) named ``name``."""
    from habana_frameworks.torch.hpex.optimizers import FusedAdamW, FusedSGD

    if name in ("FusedAdamW", "AdamW"):
        # Gaudi's kernel adds eps where torch's AdamW does not: with a negligible one both take the same steps
        optimizer_class = FusedAdamW if name == "FusedAdamW" else torch.optim.AdamW
        return {"optimizer": optimizer_class(parameters, lr=0.01, eps=1e-12, weight_decay=0.01)}
    optimizer = (FusedSGD if name == "FusedSGD" else torch.optim.SGD)(parameters, lr=0.1, momentum=0.5)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.8)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class WithOptimizer(Regression):
    def __init__(self, optimizer: str) -> None:
        super().__init__(outputs=2)
        self.optimizer_name = optimizer

    def configure_optimizers(self):
        return configure(self.optimizer_name, self.parameters())


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--optimizer", choices=("FusedAdamW", "AdamW", "FusedSGD", "SGD"), required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--max-epochs", type=int, default=1)
    parser.add_argument("--checkpoint", help="save a checkpoint here at the end of fit")
    parser.add_argument("--resume", help="fit(ckpt_path=...) from this checkpoint")
    args = parser.parse_args()
    model = WithOptimizer(args.optimizer)
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=args.devices,
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
    optimizer = trainer.optimizers[0]
    torch.save(
        {
            "state": {name: tensor.detach().float().cpu().clone() for name, tensor in model.state_dict().items()},
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "optimizer": type(optimizer).__name__,
            "lr": optimizer.param_groups[0]["lr"],
            "state_keys": sorted({key for state in optimizer.state.values() for key in state}),
        },
        os.path.join(args.out, f"rank{trainer.global_rank}.pt"),
    )


if __name__ == "__main__":
    main()
