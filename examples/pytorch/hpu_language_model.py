"""Train a small causal language model (a tiny GPT-2 from Hugging Face ``transformers``) on Intel Gaudi (HPU).

The model is built from a config, so no weights are downloaded, and it learns to continue text byte by byte. The
text is the documentation that ships inside Python's standard library (the docstrings of a few modules, about 24 KB),
so nothing is downloaded either. On a machine without Gaudi, run it with ``VIRTUAL_HPU=1`` to train on the virtual
Gaudi::

    python examples/pytorch/hpu_language_model.py --devices 2 --precision bf16-mixed

It prints the validation loss (nats per byte) before training and after every epoch.
"""

import argparse
import bisect
import collections
import dataclasses
import decimal
import fractions
import functools
import heapq
import itertools
import json
import logging
import pathlib
import random
import re
import statistics
import string
import textwrap
import typing
import unittest
from argparse import ArgumentParser

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel

import pytorch_lightning as pl

# byte-level tokens: every text is a sequence of values < 256, no tokenizer to download
VOCAB = 256
_SOURCES = (argparse, bisect, collections, dataclasses, decimal, fractions, functools, heapq, itertools, json)
_SOURCES += (logging, pathlib, random, re, statistics, string, textwrap, typing, unittest)


def standard_library_text() -> bytes:
    docs = [module.__doc__ for module in _SOURCES if module.__doc__]
    if not docs:
        raise RuntimeError("Python runs with -OO, which strips the docstrings this example trains on; run it without.")
    return "\n\n".join(docs).encode("utf-8")


class Windows(Dataset):
    """Consecutive windows of ``length`` bytes; each is both the input and, shifted by the model, the target."""

    def __init__(self, data: bytes, length: int) -> None:
        tokens = torch.tensor(list(data), dtype=torch.long)
        self.windows = tokens[: len(tokens) // length * length].view(-1, length)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.windows[index]


class TextDataModule(pl.LightningDataModule):
    """The standard library's docstrings: the first 90 % to train on, the rest to validate."""

    def __init__(self, length: int = 64, batch_size: int = 16) -> None:
        super().__init__()
        self.length, self.batch_size = length, batch_size

    def setup(self, stage: str) -> None:
        text = standard_library_text()
        split = len(text) * 9 // 10
        self.train_set, self.val_set = Windows(text[:split], self.length), Windows(text[split:], self.length)

    def train_dataloader(self) -> DataLoader:
        # equal, full batches: the step keeps one shape, so Gaudi compiles its graph once
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size, drop_last=True)


class LanguageModel(pl.LightningModule):
    """A two-layer GPT-2 with random initial weights, trained to predict the next byte."""

    def __init__(self, length: int = 64, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        config = GPT2Config(
            vocab_size=VOCAB,
            n_positions=length,
            n_embd=64,
            n_layer=2,
            n_head=4,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=None,
            eos_token_id=None,
        )
        self.model = GPT2LMHeadModel(config)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.model(input_ids=batch, labels=batch).loss
        # the epoch mean: a value on the progress bar every step would be a host sync every step on Gaudi
        self.log("train_loss", loss, prog_bar=True, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val_loss", self.model(input_ids=batch, labels=batch).loss, prog_bar=True, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


class PrintValidationLoss(pl.Callback):
    """Prints the validation loss on rank 0 after each validation run but the sanity check."""

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        when = "before training" if trainer.state.fn == "validate" else f"after epoch {trainer.current_epoch}"
        print(f"val_loss {when}: {trainer.callback_metrics['val_loss'].item():.4f}", flush=True)


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="auto", help="'hpu', 'cpu' or 'auto' (HPU when present)")
    parser.add_argument("--devices", default="1", help="number of devices, or 'auto'")
    parser.add_argument("--strategy", default="auto", help="e.g. 'hpu_single' or 'hpu_parallel'")
    parser.add_argument("--precision", default="bf16-mixed", help="'bf16-mixed', 'bf16-true' or '32-true'")
    parser.add_argument("--max-epochs", type=int, default=3)
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
        num_sanity_val_steps=0,
        callbacks=[PrintValidationLoss()],
    )
    model, data = LanguageModel(), TextDataModule()
    trainer.validate(model, datamodule=data, verbose=False)
    trainer.fit(model, datamodule=data)
    if trainer.is_global_zero:
        print(f"trained on {trainer.num_devices} x {type(trainer.accelerator).__name__} in {args.precision}")


if __name__ == "__main__":
    main()
