"""Train a tiny Hugging Face Llama with FSDP on Intel Gaudi (HPU): 2 HPUs, bf16, each holding its shard of the model.

The Llama is built from a config (nothing downloaded) and learns the standard library's documentation byte by byte,
the data of ``hpu_language_model.py``. Two modes:

- ``--mode fsdp`` (the default): FSDP with each ``LlamaDecoderLayer`` wrapped on its own (``auto_wrap_policy``);
  every rank holds about half of the parameters.
- ``--mode model_parallel``: FSDP2 and tensor parallelism. ``configure_model`` splits each decoder layer's attention
  (q, k, v by columns, o by rows) and MLP (gate, up by columns, down by rows) across the ``"tensor_parallel"``
  dimension of the device mesh, then applies ``fully_shard`` over its ``"data_parallel"`` dimension.

On a machine without Gaudi, run it on the virtual Gaudi::

    VIRTUAL_HPU=1 python examples/pytorch/hpu_fsdp.py --devices 2 --mode fsdp
    VIRTUAL_HPU=1 python examples/pytorch/hpu_fsdp.py --devices 2 --mode model_parallel

A script written for CUDA keeps ``strategy="fsdp"``, ``FSDPStrategy(...)`` or ``ModelParallelStrategy(...)``: with
``accelerator="hpu"`` they select the HPU strategies used here.
"""

import os
from argparse import ArgumentParser

import torch
from hpu_language_model import VOCAB, TextDataModule
from torch.distributed.tensor import DTensor
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

import pytorch_lightning as pl
from pytorch_lightning.strategies import HPUFSDPStrategy, HPUModelParallelStrategy


class Llama(pl.LightningModule):
    """A two-layer Llama with random initial weights, trained to predict the next byte."""

    def __init__(self, length: int = 64, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        config = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            # 4 query heads sharing 2 key/value heads: each of 2 tensor-parallel ranks computes 2 and 1 of them
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=length,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        )
        self.model = LlamaForCausalLM(config)

    def configure_model(self) -> None:
        """Only for ``--mode model_parallel``: with FSDP1, the strategy wraps the layers itself."""
        if self.device_mesh is None:
            return
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        tensor_parallel, data_parallel = self.device_mesh["tensor_parallel"], self.device_mesh["data_parallel"]
        plan = {
            # the column-split projections return each rank's own heads, and the attention reshapes its input with
            # `-1` heads, so every rank attends with its share of the heads; `o_proj` sums the ranks' partial outputs
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(),
        }
        for layer in self.model.model.layers:
            parallelize_module(layer, tensor_parallel, plan)
            fully_shard(layer, mesh=data_parallel)
        fully_shard(self.model, mesh=data_parallel)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.model(input_ids=batch, labels=batch).loss
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val_loss", self.model(input_ids=batch, labels=batch).loss.float(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # the sharded parameters: FSDP1 and FSDP2 have replaced them by the time the optimizer is created
        return torch.optim.AdamW(self.trainer.model.parameters(), lr=self.hparams.lr)


def _say(line: str) -> None:
    # one write per line: the ranks share the terminal, and `print` writes the text and its newline separately
    print(line + "\n", end="", flush=True)


class Report(pl.Callback):
    """Prints, on every rank, how many parameters it holds once training starts, and the losses after each epoch."""

    def __init__(self, total: int) -> None:
        self.total = total

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # a DTensor's `numel()` is its global size; what this rank stores is its local tensor
        held = sum(
            p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in trainer.strategy.model.parameters()
        )
        _say(f"rank {trainer.global_rank} holds {held} of {self.total} parameters")

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        metrics = trainer.callback_metrics
        _say(
            f"rank {trainer.global_rank} epoch {trainer.current_epoch}:"
            f" train_loss={metrics['train_loss']:.4f} val_loss={metrics['val_loss']:.4f}"
        )


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--mode", choices=("fsdp", "model_parallel"), default="fsdp")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--precision", default="bf16-mixed", help="'bf16-mixed', 'bf16-true' or '32-true'")
    args = parser.parse_args()

    # every rank is a process of its own with as many threads as the host has cores; on a small host (the virtual
    # Gaudi computes on it) they would contend for the cores and run several times slower: share the cores instead
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.devices))
    pl.seed_everything(42, workers=True)
    if args.mode == "fsdp":
        strategy = HPUFSDPStrategy(auto_wrap_policy={LlamaDecoderLayer})
    else:
        # tensor parallelism splits each layer over 2 HPUs (the model has 2 key/value heads to split), FSDP2 shards
        # over the pairs: with 2 HPUs, one pair
        tensor_parallel = 2 if args.devices % 2 == 0 else 1
        strategy = HPUModelParallelStrategy(
            data_parallel_size=args.devices // tensor_parallel, tensor_parallel_size=tensor_parallel
        )
    model, data = Llama(), TextDataModule()
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=args.devices,
        strategy=strategy,
        precision=args.precision,
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[Report(total=sum(p.numel() for p in model.parameters()))],
    )
    trainer.fit(model, datamodule=data)


if __name__ == "__main__":
    main()
