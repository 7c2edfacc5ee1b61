"""lightning-habana's ``examples/pytorch/mnist_sample.py``, reduced: the two classifiers ``mnist_trainer.py`` imports
(a linear layer on the flattened image; the same with its steps under ``torch.autocast("hpu", torch.bfloat16)`` and
an optional check that the op lists given to Gaudi's autocast were applied).

Added for the tests, and nothing else: each model writes down what its run did (devices, output dtype, the loss of
the first batch before and after its optimizer step, accuracies) and reports it when the stage ends. A module of
its own in lightning-habana, it has no command line; ``python mnist_sample.py`` fits each classifier once on one HPU.
"""

import os

import torch
from _support import report
from lightning_utilities import module_available
from torch.nn import functional as F

if module_available("lightning"):
    from lightning.pytorch import LightningModule
else:
    from pytorch_lightning import LightningModule


def fp8_enabled():
    """Whether Transformer Engine's fp8 autocast is on (the Trainer's fp8 plugin turns it on for the steps)."""
    from habana_frameworks.torch.hpex.experimental.transformer_engine.fp8 import is_fp8_enabled

    return is_fp8_enabled()


class LitClassifier(LightningModule):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(28 * 28, 10)
        self.observed = {}

    def forward(self, x):
        return torch.relu(self.l1(x.view(x.size(0), -1)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        if batch_idx == 0:
            self.observed.update(
                train_device=str(x.device),
                param_device=str(self.l1.weight.device),
                logits_dtype=str(logits.dtype).replace("torch.", ""),
                autocast=torch.is_autocast_enabled("hpu"),
                fp8=fp8_enabled(),
                loss_before=loss.item(),
                recipe_cache=os.environ.get("PT_HPU_RECIPE_CACHE_CONFIG"),
            )
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        # the same batch after the optimizer step: a step that learnt lowers its loss
        if batch_idx == 0:
            x, y = batch
            with torch.no_grad():
                self.observed["loss_after"] = F.cross_entropy(self(x), y).item()

    def validation_step(self, batch, batch_idx):
        x, y = batch
        probs = self(x)
        acc = self.accuracy(probs, y)
        self.log("val_acc", acc)
        self.observed["val_acc"] = acc.item()

    def test_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        acc = self.accuracy(logits, y)
        self.log("test_acc", acc)
        self.observed.update(test_acc=acc.item(), test_device=str(x.device))

    @staticmethod
    def accuracy(logits, y):
        return torch.sum(torch.eq(torch.argmax(logits, -1), y).to(torch.float32)) / len(y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.02)

    def _report(self, stage):
        trainer = self.trainer
        report(
            example="mnist_sample",
            stage=stage,
            model=type(self).__name__,
            accelerator=type(trainer.accelerator).__name__,
            strategy=type(trainer.strategy).__name__,
            precision_plugin=type(trainer.precision_plugin).__name__,
            precision=trainer.precision_plugin.precision,
            world_size=trainer.world_size,
            num_devices=trainer.num_devices,
            device_count=torch.hpu.device_count(),
            linear=f"{type(self.l1).__module__}.{type(self.l1).__name__}",
            linear_dtypes=sorted({str(tensor.dtype) for tensor in [*self.l1.parameters(), *self.l1.buffers()]}),
            memory_allocated=torch.hpu.max_memory_allocated(),
            # equal on every rank when the ranks' gradients were averaged (their batches differ)
            weight_sum=sum(parameter.detach().float().sum().item() for parameter in self.parameters()),
            **self.observed,
        )

    def on_fit_end(self):
        self._report("fit")

    def on_test_end(self):
        self._report("test")


class LitAutocastClassifier(LitClassifier):
    def __init__(self, op_override=False):
        super().__init__()
        self.op_override = op_override

    def forward(self, x):
        if self.op_override:
            self.check_override(x)
        return super().forward(x)

    def check_override(self, x):
        # passes with op lists that put `mm` in fp32 and `tan` in bf16: the example's ops_fp32_mnist.txt as the
        # lower-precision list and ops_bf16_mnist.txt as the fp32 one
        identity = torch.eye(x.shape[1], device=x.device, dtype=x.dtype)
        product, tangent = torch.mm(x, identity), torch.tan(x)
        self.observed.update(override_mm=str(product.dtype), override_tan=str(tangent.dtype))
        assert product.dtype == torch.float32
        assert tangent.dtype == torch.bfloat16

    def training_step(self, batch, batch_idx):
        with torch.autocast(device_type="hpu", dtype=torch.bfloat16):
            return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        with torch.autocast(device_type="hpu", dtype=torch.bfloat16):
            return super().validation_step(batch, batch_idx)

    def test_step(self, batch, batch_idx):
        with torch.autocast(device_type="hpu", dtype=torch.bfloat16):
            return super().test_step(batch, batch_idx)


if __name__ == "__main__":
    from _support import DigitsDataModule

    if module_available("lightning"):
        from lightning.pytorch import Trainer
    else:
        from pytorch_lightning import Trainer
    from pytorch_lightning.accelerators import HPUAccelerator
    from pytorch_lightning.strategies import SingleHPUStrategy

    for model in (LitClassifier(), LitAutocastClassifier()):
        trainer = Trainer(accelerator=HPUAccelerator(), devices=1, strategy=SingleHPUStrategy(), fast_dev_run=True)
        trainer.fit(model, DigitsDataModule(num_workers=0))
