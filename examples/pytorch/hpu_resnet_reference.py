"""Intel's Lightning ResNet reference model for Gaudi, reduced to run in seconds on the virtual Gaudi.

It makes the calls and takes the flags of ``PyTorch/computer_vision/classification/lightning/resnet/resnet50_PTL.py``
in HabanaAI/Model-References (up to release 1.14): ``hpex.optimizers.FusedSGD`` with a step or milestone learning
rate, ``htcore.mark_step()`` after the backward, accuracy computed on the CPU and moved back to the device,
``HPUParallelStrategy(broadcast_buffers=False, gradient_as_bucket_view=True, bucket_cap_mb=256, static_graph=True)``
on several HPUs, ``MixedPrecisionPlugin("bf16-mixed", "hpu")`` for ``--autocast``, ``torch.compile`` with
``--use_torch_compile`` (``backend="hpu_backend"``, which replaced the reference's ``aot_hpu_training_backend``)
and ``enable_compiled_autograd`` with ``--compiled_autograd``. The imports of ``lightning_habana`` are those of the
migration table (:doc:`hpu_migration`). What is ours: a small ResNet instead of torchvision's ResNet-50 and
synthetic 32x32 images (a class-dependent pattern plus noise) instead of ImageNet::

    VIRTUAL_HPU=1 python examples/pytorch/hpu_resnet_reference.py --hpus 2 --autocast
    VIRTUAL_HPU=1 python examples/pytorch/hpu_resnet_reference.py --use_torch_compile --compiled_autograd
    VIRTUAL_HPU=1 PT_HPU_LAZY_MODE=1 python examples/pytorch/hpu_resnet_reference.py --hpus 2
"""

import argparse
import time
from typing import Any, Optional

import torch  # first, as in the reference: on the virtual Gaudi, importing torch makes habana_frameworks importable

# isort: split
import habana_frameworks.torch.core as htcore
import torch.nn.functional as F
import torch.optim.lr_scheduler as lr_scheduler
from habana_frameworks.torch.dynamo.compile_backend.experimental import enable_compiled_autograd
from habana_frameworks.torch.hpex.optimizers import FusedSGD
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MaxMetric

from pytorch_lightning import LightningDataModule, LightningModule, Trainer, seed_everything
from pytorch_lightning.accelerators import HPUAccelerator
from pytorch_lightning.callbacks import Callback, EarlyStopping, LearningRateMonitor
from pytorch_lightning.plugins import MixedPrecisionPlugin
from pytorch_lightning.strategies import HPUParallelStrategy, SingleHPUStrategy
from pytorch_lightning.utilities.rank_zero import rank_zero_info

CLASSES = 10


def accuracy(output: torch.Tensor, target: torch.Tensor, topk: tuple = (1,)) -> list:
    """Top-k accuracies in percent, computed on the CPU and returned on the device, as the reference does."""
    output, target = output.float().to("cpu"), target.to("cpu")
    with torch.no_grad():
        _, pred = output.topk(max(topk), 1, True, True)
        correct = pred.t().eq(target[None])
        return [correct[:k].flatten().sum(dtype=torch.float32).to("hpu") * (100.0 / target.size(0)) for k in topk]


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a shortcut, as in torchvision's ResNet."""

    def __init__(self, inputs: int, outputs: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """A ResNet of three stages of one block each (ResNet-50 has four stages of bottleneck blocks)."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layers = nn.Sequential(BasicBlock(16, 16), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2))
        self.fc = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class SyntheticImageNet(LightningDataModule):
    """32x32 RGB images whose class is a fixed random pattern under noise; split into train and validation."""

    def __init__(self, batch_size: int, train_size: int = 256, val_size: int = 64) -> None:
        super().__init__()
        self.batch_size, self.sizes = batch_size, (train_size, val_size)

    def setup(self, stage: str) -> None:
        generator = torch.Generator().manual_seed(0)
        patterns = torch.randn(CLASSES, 3, 32, 32, generator=generator)
        sets = []
        for size in self.sizes:
            labels = torch.randint(0, CLASSES, (size,), generator=generator)
            images = patterns[labels] + 1.5 * torch.randn(size, 3, 32, 32, generator=generator)
            sets.append(TensorDataset(images, labels))
        self.train_set, self.val_set = sets

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size, drop_last=True)


class LoggingCallback(Callback):
    """Throughput after a warm-up, as the reference's ``--benchmark`` mode prints it."""

    def __init__(self, global_batch_size: int, warmup: int = 2) -> None:
        self.global_batch_size, self.warmup, self.steps, self.started = global_batch_size, warmup, 0, 0.0

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.steps = 0

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self.steps += 1
        if self.steps == self.warmup:
            self.started = time.time()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        throughput = (self.steps - self.warmup) * self.global_batch_size / (time.time() - self.started)
        rank_zero_info(f"throughput_train = {throughput:.1f}")


class ImageNetLightningModel(LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.model = SmallResNet()
        if args.use_torch_compile:
            self.model = torch.compile(self.model, backend="hpu_backend")
        self.eval_best_acc = MaxMetric()
        self.eval_accuracies: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def on_after_backward(self) -> None:
        htcore.mark_step()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, target = batch
        output = self.model(images)
        loss = F.cross_entropy(output, target)
        self.log("train_loss", loss)
        if not self.args.benchmark:
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            self.log("train_acc1", acc1, prog_bar=True)
            self.log("train_acc5", acc5, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, targets = batch
        preds = self.model(images)
        loss = F.cross_entropy(preds, targets)
        self.log("val_loss", loss)
        acc1, acc5 = accuracy(preds, targets, topk=(1, 5))
        self.log("val_acc1", acc1, prog_bar=True, sync_dist=self.args.hpus > 1)
        self.log("val_acc5", acc5, prog_bar=True)
        self.eval_accuracies.append(acc1)
        return loss

    def on_validation_epoch_end(self) -> None:
        val_accuracy = torch.mean(torch.stack(self.eval_accuracies))
        self.log("epoch_eval_accuracy", val_accuracy, on_epoch=True, prog_bar=True, sync_dist=self.args.hpus > 1)
        self.eval_best_acc.update(val_accuracy)
        self.log("top_eval_accuracy", self.eval_best_acc.compute(), on_epoch=True, prog_bar=True)
        self.eval_accuracies.clear()

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        optimizer.zero_grad(set_to_none=True)

    def configure_optimizers(self) -> Any:
        args = self.args
        optimizer = FusedSGD(self.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
        scheduler = lr_scheduler.StepLR(optimizer, step_size=args.lr_step_size, gamma=args.lr_gamma)
        return [optimizer], [scheduler]


def train_model(args: argparse.Namespace) -> Trainer:
    model = ImageNetLightningModel(args)
    strategy: Optional[Any] = None
    if args.hpus > 1:
        strategy = HPUParallelStrategy(
            parallel_devices=[torch.device("hpu")] * args.hpus,
            broadcast_buffers=False,
            gradient_as_bucket_view=True,
            bucket_cap_mb=256,
            static_graph=True,
        )
    elif args.hpus == 1:
        strategy = SingleHPUStrategy()
    callbacks: list = [LearningRateMonitor(logging_interval="step")]
    if args.benchmark:
        callbacks = [LoggingCallback(global_batch_size=args.batch_size * args.hpus)]
    else:
        callbacks.append(EarlyStopping(monitor="top_eval_accuracy", mode="max", min_delta=0.0, patience=30))
    trainer = Trainer(
        max_epochs=args.epochs,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        devices=args.hpus,
        accelerator=HPUAccelerator(),
        callbacks=callbacks,
        strategy=strategy,
        plugins=[MixedPrecisionPlugin(precision="bf16-mixed", device="hpu")] if args.autocast else [],
        logger=not args.benchmark,
        default_root_dir=args.default_root_dir,
        use_distributed_sampler=False,
        deterministic=False,
        num_sanity_val_steps=0,
        limit_val_batches=0.0 if args.benchmark else None,
    )
    trainer.fit(model, datamodule=SyntheticImageNet(args.batch_size))
    return trainer


def main() -> None:
    parser = argparse.ArgumentParser(description="Reduced Lightning ResNet reference model for Gaudi")
    parser.add_argument("--hpus", default=1, type=int)
    parser.add_argument("--epochs", default=3, type=int)
    parser.add_argument("--batch_size", default=32, type=int)
    parser.add_argument("--lr", default=0.1, type=float)
    parser.add_argument("--lr_step_size", default=2, type=int)
    parser.add_argument("--lr_gamma", default=0.1, type=float)
    parser.add_argument("--default_root_dir", default=None, help="where the logs go (default: the working directory)")
    parser.add_argument("--autocast", action="store_true", help="bf16 autocast on Gaudi")
    parser.add_argument("--benchmark", action="store_true", help="measure throughput, no validation")
    parser.add_argument("--use_torch_compile", action="store_true", help="torch.compile with hpu_backend")
    parser.add_argument("--compiled_autograd", action="store_true", help="compile the backward too")
    args = parser.parse_args()
    seed_everything(1234)
    if args.compiled_autograd:
        if not args.use_torch_compile:
            raise ValueError("--compiled_autograd requires --use_torch_compile")
        enable_compiled_autograd()
    started = time.time()
    trainer = train_model(args)
    metrics = {
        k: round(float(v), 4) for k, v in trainer.callback_metrics.items() if k in ("train_loss", "top_eval_accuracy")
    }
    if trainer.is_global_zero:
        print(f"final metrics {metrics} on {args.hpus} HPU(s) in {time.time() - started:.1f} s")


if __name__ == "__main__":
    main()
