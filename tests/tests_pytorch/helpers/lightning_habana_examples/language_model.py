"""lightning-habana's ``examples/pytorch/language_model.py``, reduced: upstream's demo ``Transformer`` language model
on two or more HPUs, sharded with ``HPUFSDPStrategy`` (``--strategy`` FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD or
NO_SHARD: ``parallel_devices=[torch.device("hpu")] * devices``, the encoder and decoder layers wrapped as FSDP units,
``precision_plugin=HPUFSDPPrecision("bf16-mixed")``, one step) or replicated (``--strategy DDP``: ``HPUDDPStrategy()``
with ``HPUPrecisionPlugin(device="hpu", precision="bf16-mixed")``, ten steps); the peak memory of the HPU is printed.

Only the imports of ``lightning_habana`` changed, and the data: a generated token stream in place of
``WikiText2()``'s download, with a vocabulary of 64. lightning-habana's check ``_LIGHTNING_GREATER_EQUAL_2_3_0``
(``lightning_habana.utils.imports``) has no counterpart: this package is built on Lightning 2.6. Added for the
tests: the model writes down what its steps saw (devices, autocast, losses, how many parameters this rank holds and
their sum before and after the steps) and reports it when the fit ends.
"""

import argparse
import os
import sys

import torch
import torch.nn as nn
from _support import TokenStream, report
from lightning_utilities import module_available
from torch.utils.data import DataLoader

if module_available("lightning"):
    from lightning.pytorch import LightningModule, Trainer, seed_everything
    from lightning.pytorch.demos import Transformer
    from lightning.pytorch.utilities import rank_zero_info
else:
    from pytorch_lightning import LightningModule, Trainer, seed_everything
    from pytorch_lightning.demos import Transformer
    from pytorch_lightning.utilities import rank_zero_info

import habana_frameworks.torch as htorch

from pytorch_lightning.accelerators import HPUAccelerator
from pytorch_lightning.plugins import HPUFSDPPrecision, HPUPrecisionPlugin
from pytorch_lightning.strategies import HPUDDPStrategy, HPUFSDPStrategy

STRATEGIES = ["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD", "DDP"]


class LanguageModel(LightningModule):
    def __init__(self, vocab_size):
        super().__init__()
        self.model = Transformer(vocab_size=vocab_size)
        self.total_parameters = sum(parameter.numel() for parameter in self.parameters())
        self.observed = {"losses": []}

    def training_step(self, batch):
        inputs, target = batch
        output = self.model(inputs, target)
        loss = nn.functional.nll_loss(output, target.view(-1))
        self.log("train_loss", loss, prog_bar=True)
        self.observed.update(
            train_device=str(inputs.device), autocast=torch.is_autocast_enabled("hpu"), output_dtype=str(output.dtype)
        )
        self.observed["losses"].append(loss.item())
        return loss

    def on_train_start(self):
        # the parameters this rank holds: a shard of the model with FSDP (padding included), all of it otherwise
        held = sum(parameter.numel() for parameter in self.trainer.strategy.model.parameters())
        fsdp_units = sum(type(module).__name__ == "FullyShardedDataParallel" for module in self.modules())
        self.observed.update(held_parameters=held, total_parameters=self.total_parameters, fsdp_units=fsdp_units)
        self.observed["held_sum_before"] = self._held_sum()

    def _held_sum(self):
        return sum(parameter.detach().float().sum().item() for parameter in self.trainer.strategy.model.parameters())

    def on_fit_end(self):
        trainer = self.trainer
        report(
            example="language_model",
            accelerator=type(trainer.accelerator).__name__,
            strategy=type(trainer.strategy).__name__,
            sharding=getattr(getattr(trainer.strategy, "sharding_strategy", None), "name", None),
            precision_plugin=type(trainer.precision_plugin).__name__,
            precision=trainer.precision_plugin.precision,
            world_size=trainer.world_size,
            num_devices=trainer.num_devices,
            peak_memory=htorch.hpu.max_memory_allocated(),
            # the parameters this rank holds, after the steps: equal on both ranks when they are replicas
            held_sum_after=self._held_sum(),
            **self.observed,
        )

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.1)


def parse_args():
    parser = argparse.ArgumentParser(description="lightning-habana's language model example, reduced")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-d", "--devices", type=int, default=2, help="number of HPUs (2 or more)")
    parser.add_argument("-s", "--strategy", type=str, default="FULL_SHARD", help=f"one of {', '.join(STRATEGIES)}")
    return parser.parse_args()


if __name__ == "__main__":
    seed_everything(42)
    options = parse_args()
    if options.verbose:
        print(f"language model on HPUs, options: {options}", flush=True)
    # as the example; it takes effect only when set before the process starts (lightning-habana's CI did)
    os.environ["PT_HPU_LAZY_MODE"] = "0"
    if options.devices < 2:
        print("The example needs two or more HPUs")
        sys.exit(1)
    if options.strategy not in STRATEGIES:
        print(f"Unknown strategy {options.strategy}: choose one of {', '.join(STRATEGIES)}")
        sys.exit(1)

    policy = {nn.TransformerEncoderLayer, nn.TransformerDecoderLayer}
    dataset = TokenStream()
    train_dataloader = DataLoader(dataset, num_workers=2)
    model = LanguageModel(vocab_size=dataset.vocab_size)

    if options.strategy == "DDP":
        trainer = Trainer(
            accelerator=HPUAccelerator(),
            devices=options.devices,
            strategy=HPUDDPStrategy(),
            plugins=HPUPrecisionPlugin(device="hpu", precision="bf16-mixed"),
            fast_dev_run=10,
            enable_model_summary=True,
        )
    else:
        strategy = HPUFSDPStrategy(
            parallel_devices=[torch.device("hpu")] * options.devices,
            sharding_strategy=options.strategy,
            auto_wrap_policy=policy,
            precision_plugin=HPUFSDPPrecision("bf16-mixed"),
        )
        trainer = Trainer(
            accelerator=HPUAccelerator(),
            devices=options.devices,
            strategy=strategy,
            fast_dev_run=1,
            enable_model_summary=True,
        )
    trainer.fit(model, train_dataloader)
    rank_zero_info(
        f"Peak memory allocated with the {options.strategy} strategy on HPU:"
        f" {htorch.hpu.max_memory_allocated() / 1024**3} GB"
    )
    htorch.hpu.reset_peak_memory_stats()
