"""Data modules for training on Intel Gaudi (HPUs). Upstream Lightning has no such package: everything here is ours."""

from pytorch_lightning.datamodules.hpu import HPUDataModule

__all__ = ["HPUDataModule"]
