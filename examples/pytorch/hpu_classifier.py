"""Train a handwritten-digit classifier with PyTorch Lightning on Intel Gaudi (HPU).

The data is scikit-learn's copy of the UCI handwritten digits (1,797 8x8 images), so nothing is downloaded. On a
machine without Gaudi, run it with ``VIRTUAL_HPU=1`` to train on the virtual Gaudi::

    python examples/pytorch/hpu_classifier.py --devices 2 --precision bf16-mixed

On HPUs it takes the default path of current Gaudi software, eager mode with the model compiled by
``torch.compile(backend="hpu_backend")``, and prints how many graphs were compiled. ``--no-compile`` trains
eagerly op by op; ``PT_HPU_LAZY_MODE=1`` selects the legacy lazy mode, which does not compile.
"""

from argparse import ArgumentParser

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

import pytorch_lightning as pl
from pytorch_lightning.accelerators import HPUAccelerator


class DigitsDataModule(pl.LightningDataModule):
    """Scikit-learn's handwritten digits, scaled to [0, 1] and split 70/15/15 with a fixed seed."""

    def __init__(self, batch_size: int = 64) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        images, labels = load_digits(return_X_y=True)
        dataset = TensorDataset(
            torch.tensor(images / 16.0, dtype=torch.float32).view(-1, 1, 8, 8), torch.tensor(labels)
        )
        generator = torch.Generator().manual_seed(0)
        self.train_set, self.val_set, self.test_set = random_split(dataset, [0.7, 0.15, 0.15], generator=generator)

    def train_dataloader(self) -> DataLoader:
        # a ragged last batch would be a new shape, compiled anew, at the end of every epoch
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=256)


class DigitsClassifier(pl.LightningModule):
    """A small convolutional network for 8x8 digit images."""

    def __init__(self, lr: float = 2e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 4 * 4, 128),
            nn.ReLU(),
            nn.Linear(128, 10),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        loss = F.cross_entropy(self(images), labels)
        # the epoch's mean: a value shown or logged every step would be read on the host every step
        self.log("train_loss", loss, prog_bar=True, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def _evaluate(self, batch: tuple, stage: str) -> None:
        images, labels = batch
        logits = self(images)
        self.log(f"{stage}_loss", F.cross_entropy(logits, labels), prog_bar=True, sync_dist=True)
        self.log(f"{stage}_acc", (logits.argmax(-1) == labels).float().mean(), prog_bar=True, sync_dist=True)

    def validation_step(self, batch: tuple, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: tuple, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def predict_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        images, _ = batch
        return self(images)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="auto", help="'hpu', 'cpu' or 'auto' (HPU when present)")
    parser.add_argument("--devices", default="1", help="number of devices, or 'auto'")
    parser.add_argument("--strategy", default="auto", help="e.g. 'hpu_single' or 'hpu_parallel'")
    parser.add_argument("--precision", default="32-true", help="'32-true', 'bf16-mixed' or '16-mixed'")
    parser.add_argument("--max-epochs", type=int, default=8)
    parser.add_argument("--no-compile", action="store_true", help="on HPUs, train eagerly without torch.compile")
    args = parser.parse_args()

    pl.seed_everything(42, workers=True)
    devices = args.devices if args.devices == "auto" else int(args.devices)
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=devices,
        strategy=args.strategy,
        precision=args.precision,
        max_epochs=args.max_epochs,
        logger=False,
        enable_checkpointing=False,
    )
    model, data = DigitsClassifier(), DigitsDataModule()
    on_hpu = isinstance(trainer.accelerator, HPUAccelerator)
    compiled = on_hpu and not args.no_compile and not HPUAccelerator.is_lazy()
    runner = torch.compile(model, backend="hpu_backend") if compiled else model
    trainer.fit(runner, datamodule=data)
    (metrics,) = trainer.test(runner, datamodule=data, verbose=False)
    if compiled and trainer.is_global_zero:
        from habana_frameworks.torch.hpu.metrics import metric_global

        count = dict(metric_global("graph_compilation").stats())["TotalNumber"]
        print(f"graph compilations (hpu_backend, rank 0): {count}")
    if trainer.is_global_zero:
        print(f"final metrics on {trainer.num_devices} x {trainer.accelerator.__class__.__name__}: ", end="")
        print(", ".join(f"{name}={value:.4f}" for name, value in sorted(metrics.items())))


if __name__ == "__main__":
    main()
