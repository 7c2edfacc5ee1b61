"""Intel's Lightning UNet reference model for Gaudi, reduced to run in seconds on the virtual Gaudi.

It makes the calls and takes the flags of ``PyTorch/computer_vision/segmentation/Unet`` in HabanaAI/Model-References
(``main.py``, ``lightning_trainer/ptl.py``, ``models/nn_unet.py``, ``utils/utils.py``): ``lightning.pytorch``'s
``Trainer`` with ``HPUAccelerator()``, ``HPUDDPStrategy(bucket_cap_mb=..., gradient_as_bucket_view=True,
static_graph=True)`` on several HPUs and ``SingleHPUStrategy()`` on one, ``precision="bf16-mixed"`` for ``--amp``,
``HPUProfiler`` for ``--profile``; Gaudi's dynamic shapes switched by ``HPU_DISABLE_DYNAMIC_SHAPE``;
``htcore.mark_step()`` after the training step, the backward, the optimizer step and the evaluation steps with
``--run-lazy-mode`` (under ``PT_HPU_LAZY_MODE=1``); ``hpex.optimizers.FusedAdamW`` for ``--optimizer fusedadamw`` and
the ``multistep``, ``cosine`` and ``plateau`` schedulers on ``val_loss``; early stopping and checkpoints on the Dice
score ``dice_sum``; the ``train`` and ``evaluate`` modes (the latter from ``--ckpt_path`` through
``load_from_checkpoint``) and ``--benchmark``, whose inference runs the test twice. The imports of
``lightning_habana`` are those of the migration table (:doc:`hpu_migration`). What is ours: a small 2D UNet instead of
nnU-Net's, synthetic 32x32 one-channel images (bright squares are class 1, dark squares class 2, on noise) instead of
the Medical Segmentation Decathlon's preprocessed volumes, a Dice metric and a Dice plus cross-entropy loss of our
own, a few epochs of a few batches, and ``--run-lazy-mode`` as a switch (off by default, as Gaudi now runs eagerly)::

    VIRTUAL_HPU=1 python examples/pytorch/hpu_unet_reference.py --hpus 2 --amp
    VIRTUAL_HPU=1 PT_HPU_LAZY_MODE=1 python examples/pytorch/hpu_unet_reference.py --hpus 2 --run-lazy-mode \\
        --optimizer fusedadamw --scheduler plateau
    VIRTUAL_HPU=1 python examples/pytorch/hpu_unet_reference.py --hpus 1 --save_ckpt --results /tmp/unet
    VIRTUAL_HPU=1 python examples/pytorch/hpu_unet_reference.py --hpus 1 --exec_mode evaluate \\
        --ckpt_path /tmp/unet/checkpoints/last.ckpt
    VIRTUAL_HPU=1 python examples/pytorch/hpu_unet_reference.py --hpus 1 --benchmark --exec_mode predict
"""

import argparse
import os
import time
from typing import Any, Optional

import torch  # first, as in the reference: on the virtual Gaudi, importing torch makes habana_frameworks importable
import torch.nn.functional as F
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchmetrics import Metric

from pytorch_lightning.accelerators import HPUAccelerator
from pytorch_lightning.profilers import HPUProfiler
from pytorch_lightning.strategies import HPUDDPStrategy, SingleHPUStrategy

CLASSES = 3  # background, bright squares, dark squares
SIZE = 32


def mark_step(run_lazy_mode: bool) -> None:
    """Cut the lazy graph here; in eager mode there is nothing to cut."""
    if run_lazy_mode:
        import habana_frameworks.torch.core as htcore

        htcore.mark_step()


def is_main_process() -> bool:
    return int(os.getenv("LOCAL_RANK", "0")) == 0


def set_env_params(args: argparse.Namespace) -> None:
    """The reference's environment set-up: the lazy-mode check, DDP's first bucket, Gaudi's dynamic shapes."""
    lazy_env = os.getenv("PT_HPU_LAZY_MODE")
    if args.run_lazy_mode and lazy_env not in (None, "1"):
        raise ValueError(f"--run-lazy-mode needs PT_HPU_LAZY_MODE=1 (or unset), not PT_HPU_LAZY_MODE={lazy_env}")
    if args.hpus > 1:
        torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = 130 * 1024 * 1024
    import habana_frameworks.torch.hpu as hthpu

    if os.getenv("HPU_DISABLE_DYNAMIC_SHAPE", "False").lower() in ("true", "1"):
        hthpu.disable_dynamic_shape()
    else:
        hthpu.enable_dynamic_shape()


def load_hpu_library() -> None:
    import habana_frameworks.torch.core
    import habana_frameworks.torch.distributed.hccl
    import habana_frameworks.torch.hpu  # noqa: F401


class Dice(Metric):
    """Per-class Dice score of the foreground classes, 2|P∩T| / (|P| + |T|), summed over all pixels and ranks."""

    full_state_update = False

    def __init__(self, n_class: int) -> None:
        super().__init__()
        self.n_class = n_class
        self.add_state("overlap", torch.zeros(n_class), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros(n_class), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, target: torch.Tensor) -> None:
        predicted = F.one_hot(logits.argmax(1), self.n_class + 1)[..., 1:]
        expected = F.one_hot(target.long(), self.n_class + 1)[..., 1:]
        self.overlap += (predicted * expected).sum((0, 1, 2))
        self.total += predicted.sum((0, 1, 2)) + expected.sum((0, 1, 2))

    def compute(self) -> torch.Tensor:
        return 2 * self.overlap / self.total.clamp(min=1)


def segmentation_loss(logits: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """Cross entropy plus one minus the soft Dice of all classes, in float32 also under bf16 autocast."""
    logits, target = logits.float(), label[:, 0].long()
    probabilities = logits.softmax(1)
    one_hot = F.one_hot(target, logits.shape[1]).permute(0, 3, 1, 2).float()
    overlap = (probabilities * one_hot).sum((0, 2, 3))
    sizes = probabilities.sum((0, 2, 3)) + one_hot.sum((0, 2, 3))
    soft_dice = ((2 * overlap + 1) / (sizes + 1)).mean()
    return F.cross_entropy(logits, target) + 1 - soft_dice


def conv_block(inputs: int, outputs: int, norm: str, negative_slope: float, stride: int = 1) -> nn.Sequential:
    """Two 3x3 convolutions, each followed by a normalization and a leaky ReLU; the first may downsample."""
    layers: list = []
    for i in range(2):
        layers.append(nn.Conv2d(inputs if i == 0 else outputs, outputs, 3, stride if i == 0 else 1, 1, bias=False))
        layers.append(nn.InstanceNorm2d(outputs, affine=True) if norm == "instance" else nn.BatchNorm2d(outputs))
        layers.append(nn.LeakyReLU(negative_slope, inplace=True))
    return nn.Sequential(*layers)


class SmallUNet(nn.Module):
    """An encoder of three levels (stride-2 convolutions), a decoder of transposed convolutions that concatenates the
    encoder's features of the same level, and a 1x1 convolution to the class logits."""

    def __init__(self, in_channels: int, n_class: int, norm: str, negative_slope: float) -> None:
        super().__init__()
        self.filters = [8, 16, 32]
        f = self.filters
        self.encoder = nn.ModuleList(
            [
                conv_block(in_channels, f[0], norm, negative_slope),
                conv_block(f[0], f[1], norm, negative_slope, stride=2),
                conv_block(f[1], f[2], norm, negative_slope, stride=2),
            ]
        )
        self.upsample = nn.ModuleList([nn.ConvTranspose2d(f[2], f[1], 2, 2), nn.ConvTranspose2d(f[1], f[0], 2, 2)])
        self.decoder = nn.ModuleList(
            [
                conv_block(2 * f[1], f[1], norm, negative_slope),
                conv_block(2 * f[0], f[0], norm, negative_slope),
            ]
        )
        self.output = nn.Conv2d(f[0], n_class, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.encoder:
            x = block(x)
            skips.append(x)
        for upsample, block, skip in zip(self.upsample, self.decoder, reversed(skips[:-1])):
            x = block(torch.cat([upsample(x), skip], 1))
        return self.output(x)


class SyntheticSegmentation(Dataset):
    """Noisy images with one to three squares each, bright (class 1) or dark (class 2), as ``{"image", "label"}``."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)

        def draw(high: int) -> int:
            return int(torch.randint(high, (1,), generator=generator))

        self.labels = torch.zeros(size, 1, SIZE, SIZE, dtype=torch.uint8)
        for label in self.labels:
            for _ in range(1 + draw(3)):
                side = 4 + draw(7)
                top, left = draw(SIZE - side), draw(SIZE - side)
                label[0, top : top + side, left : left + side] = 1 + draw(2)
        noise = 0.5 * torch.randn(size, 1, SIZE, SIZE, generator=generator)
        self.images = noise + (self.labels == 1).float() - (self.labels == 2).float()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict:
        return {"image": self.images[index], "label": self.labels[index]}


class DataModule:
    """Train, validation and test sets of fixed content, whatever the seed of the run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.train_set, self.val_set, self.test_set = (
            SyntheticSegmentation(args.train_size, 0),
            SyntheticSegmentation(args.val_size, 1),
            SyntheticSegmentation(args.val_size, 2),
        )

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.args.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.args.val_batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=self.args.val_batch_size)


class LoggingCallback(Callback):
    """Images per second of training or test after ``warmup`` batches, as the reference's logger reports them."""

    def __init__(self, global_batch_size: int, warmup: int) -> None:
        self.global_batch_size, self.warmup = global_batch_size, warmup
        self.reset()

    def reset(self) -> None:
        self.batches, self.started = 0, None

    def _count(self) -> None:
        self.batches += 1
        if self.batches == self.warmup + 1:
            self.started = time.perf_counter()

    def _report(self, stage: str) -> None:
        if self.started is not None:
            elapsed = time.perf_counter() - self.started
            throughput = (self.batches - self.warmup) * self.global_batch_size / elapsed
            rank_zero_info(f"throughput_{stage} = {throughput:.1f} images/s")

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.reset()

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._count()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._report("train")

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.reset()

    def on_test_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._count()

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._report("test")


class NNUnet(LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.save_hyperparameters()
        self.n_class = CLASSES - 1
        self.model = SmallUNet(1, CLASSES, args.norm, args.negative_slope)
        self.dice = Dice(self.n_class)
        self.validation_losses: list = []
        self.start_loss: Optional[torch.Tensor] = None
        self.eval_dice: Optional[torch.Tensor] = None
        if is_main_process():
            print(f"Filters: {self.model.filters}")

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return self.model(img)

    def _to_device(self, batch: dict) -> tuple:
        hpu = torch.device("hpu")
        return batch["image"].to(hpu, non_blocking=False), batch["label"].to(hpu, non_blocking=False)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        img, lbl = self._to_device(batch)
        loss = segmentation_loss(self.model(img), lbl)
        mark_step(self.args.run_lazy_mode)
        if self.start_loss is None:
            self.start_loss = loss.detach().clone()
        self.log("loss", loss, on_step=False, on_epoch=True, prog_bar=True, sync_dist=True)
        return loss

    def on_after_backward(self) -> None:
        mark_step(self.args.run_lazy_mode)

    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        mark_step(self.args.run_lazy_mode)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        optimizer.step(closure=optimizer_closure)
        mark_step(self.args.run_lazy_mode)

    def validation_step(self, batch: dict, batch_idx: int) -> dict:
        img, lbl = self._to_device(batch)
        pred = self.forward(img)
        self.dice.update(pred, lbl[:, 0])
        loss = segmentation_loss(pred, lbl)
        mark_step(self.args.run_lazy_mode)
        self.validation_losses.append(loss)
        return {"val_loss": loss}

    def _log_dice(self) -> torch.Tensor:
        loss = torch.stack(self.validation_losses).mean()
        self.validation_losses.clear()
        dice = self.dice.compute()
        self.dice.reset()
        self.log("val_loss", loss, sync_dist=True)
        self.log("dice_sum", dice.sum(), sync_dist=True)  # the same on every rank: Dice gathers its counts
        self.log("mean_dice", dice.mean(), sync_dist=True)
        return dice

    def on_validation_epoch_end(self) -> None:
        self._log_dice()

    def test_step(self, batch: dict, batch_idx: int) -> Optional[dict]:
        if self.args.exec_mode == "evaluate":
            return self.validation_step(batch, batch_idx)
        pred = self.forward(batch["image"].to(torch.device("hpu"), non_blocking=False))
        mark_step(self.args.run_lazy_mode)
        if self.args.benchmark and batch_idx == self.trainer.num_test_batches[0] - 1:
            pred.cpu()  # the last batch waits for the device, so that the measured time covers all batches
        return None

    def on_test_epoch_end(self) -> None:
        if self.args.exec_mode == "evaluate":
            self.eval_dice = self._log_dice()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        for state in checkpoint["callbacks"].values():
            if isinstance(state, dict):
                for key, value in state.items():
                    if isinstance(value, torch.Tensor):
                        state[key] = value.to("cpu")

    def configure_optimizers(self) -> dict:
        args = self.args
        self.model = self.model.to(torch.device("hpu"))
        name = args.optimizer.lower()
        if name == "sgd":
            optimizer = torch.optim.SGD(self.parameters(), lr=args.learning_rate, momentum=args.momentum)
        elif name == "adam":
            optimizer = torch.optim.Adam(self.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
        elif name == "radam":
            optimizer = torch.optim.RAdam(self.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
        elif name == "adamw":
            optimizer = torch.optim.AdamW(self.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
        elif name == "fusedadamw":
            from habana_frameworks.torch.hpex.optimizers import FusedAdamW

            optimizer = FusedAdamW(self.parameters(), lr=args.learning_rate, eps=1e-08, weight_decay=args.weight_decay)
        else:
            raise ValueError(f"optimizer {args.optimizer} is not supported")
        schedulers = {
            "none": lambda: None,
            "multistep": lambda: torch.optim.lr_scheduler.MultiStepLR(optimizer, args.steps, gamma=args.factor),
            "cosine": lambda: torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.max_epochs),
            "plateau": lambda: torch.optim.lr_scheduler.ReduceLROnPlateau(
                optimizer, factor=args.factor, patience=args.lr_patience
            ),
        }
        scheduler = schedulers[args.scheduler.lower()]()
        configuration: dict = {"optimizer": optimizer, "monitor": "val_loss"}
        if scheduler is not None:
            configuration["lr_scheduler"] = scheduler
        return configuration


def make_profiler(args: argparse.Namespace) -> Optional[HPUProfiler]:
    """``--profile_steps first:last`` (1-based, inclusive): the steps before ``first`` warm up, the rest are traced."""
    if not args.profile:
        return None
    if not torch.profiler.kineto_available():
        print("HPUProfiler needs Kineto, which this torch lacks: not profiling")
        return None
    first, _, last = args.profile_steps.partition(":")
    warmup = int(first) - 1
    active = int(last or first) - warmup
    if warmup < 0 or active < 1:
        raise ValueError(f"--profile_steps {args.profile_steps}: expected first:last with 1 <= first <= last")
    return HPUProfiler(
        dirpath=args.results,
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=0, warmup=warmup, active=active),
        record_shapes=False,
        with_stack=True,
        record_module_names=False,
    )


def ptlrun(args: argparse.Namespace) -> None:
    if is_main_process():
        print(args)
    set_env_params(args)
    load_hpu_library()
    torch.serialization.add_safe_globals([argparse.Namespace])
    profiler = make_profiler(args)
    seed_everything(args.seed)
    data_module = DataModule(args)
    ckpt_path = args.ckpt_path
    if args.resume_training and args.results:
        last = os.path.join(args.results, "checkpoints", "last.ckpt")
        ckpt_path = last if os.path.exists(last) else ckpt_path

    callbacks: list = []
    progress_bar = TQDMProgressBar(refresh_rate=args.progress_bar_refresh_rate)
    batch_size = args.batch_size if args.exec_mode == "train" else args.val_batch_size
    logging_callback = LoggingCallback(global_batch_size=batch_size * args.hpus, warmup=args.warmup)
    if args.benchmark:
        model = NNUnet(args)
        callbacks = [logging_callback, progress_bar]
    elif args.exec_mode == "train":
        model = NNUnet(args)
        callbacks = [
            logging_callback,
            EarlyStopping(monitor="dice_sum", patience=args.patience, verbose=True, mode="max"),
            progress_bar,
        ]
        if args.save_ckpt:
            callbacks.append(ModelCheckpoint(monitor="dice_sum", mode="max", save_last=True))
    elif ckpt_path is not None:
        model = NNUnet.load_from_checkpoint(ckpt_path)
    else:
        model = NNUnet(args)

    trainer = Trainer(
        logger=False,
        profiler=profiler,
        precision="bf16-mixed" if args.amp else "32-true",
        devices=args.hpus,
        accelerator=HPUAccelerator(),
        benchmark=True,
        deterministic=False,
        min_epochs=args.min_epochs,
        max_epochs=args.max_epochs,
        sync_batchnorm=args.sync_batchnorm,
        gradient_clip_val=args.gradient_clip_val,
        callbacks=callbacks,
        num_sanity_val_steps=0,
        default_root_dir=args.results,
        enable_checkpointing=args.save_ckpt,
        strategy=HPUDDPStrategy(
            parallel_devices=[torch.device("hpu")] * args.hpus,
            bucket_cap_mb=args.bucket_cap_mb,
            gradient_as_bucket_view=True,
            static_graph=True,
        )
        if args.hpus > 1
        else SingleHPUStrategy(),
        limit_train_batches=args.train_batches or 1.0,
        limit_val_batches=args.test_batches or 1.0,
        limit_test_batches=args.test_batches or 1.0,
    )

    started = time.time()
    if args.benchmark and args.exec_mode == "train":
        trainer.fit(model, train_dataloaders=data_module.train_dataloader())
    elif args.benchmark:
        trainer.test(model, dataloaders=data_module.test_dataloader())  # warm-up
        logging_callback.reset()
        trainer.test(model, dataloaders=data_module.test_dataloader())  # measured
    elif args.exec_mode == "train":
        trainer.fit(
            model,
            train_dataloaders=data_module.train_dataloader(),
            val_dataloaders=data_module.val_dataloader(),
            ckpt_path=ckpt_path,
        )
    elif args.exec_mode == "evaluate":
        model.args = args
        trainer.test(model, dataloaders=data_module.val_dataloader())
    else:
        model.args = args
        trainer.test(model, dataloaders=data_module.test_dataloader())

    metrics = {k: round(float(v), 4) for k, v in trainer.callback_metrics.items()}
    if model.start_loss is not None:
        metrics["start_loss"] = round(float(model.start_loss), 4)
    if model.eval_dice is not None:
        metrics.update({f"L{i + 1}": round(float(d), 4) for i, d in enumerate(model.eval_dice)})
    from habana_frameworks.torch.utils.internal import is_lazy

    optimizer = type(trainer.optimizers[0]).__name__ if trainer.optimizers else "no optimizer"
    setup = f"{type(trainer.strategy).__name__}, {trainer.precision}, {'lazy' if is_lazy() else 'eager'}, {optimizer}"
    if trainer.is_global_zero:
        print(
            f"final metrics {metrics} on {trainer.world_size} HPU(s) ({setup}, {args.scheduler})"
            f" in {time.time() - started:.1f} s"
        )


def get_main_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Reduced Lightning UNet reference model for Gaudi",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )

    def arg(name: str, **kwargs: Any) -> None:
        # the reference's spelling (``--save_ckpt``) and the hyphenated one (``--save-ckpt``)
        names = dict.fromkeys([name, name.replace("_", "-")])
        parser.add_argument(*names, **kwargs)

    arg("--exec_mode", choices=["train", "evaluate", "predict"], default="train", help="what to run")
    arg("--results", default=None, help="directory of checkpoints and traces (default: the working directory)")
    arg("--hpus", type=int, default=1, help="number of HPUs")
    arg("--learning_rate", type=float, default=0.01)
    arg("--gradient_clip_val", type=float, default=0.0, help="gradient clipping norm (0: none)")
    arg("--negative_slope", type=float, default=0.01, help="slope of the leaky ReLU")
    arg("--amp", action="store_true", help="bf16 mixed precision")
    arg("--benchmark", action="store_true", help="measure throughput: fit without validation, or test twice")
    arg("--sync_batchnorm", action="store_true", help="synchronize batch norm across HPUs")
    arg("--save_ckpt", action="store_true", help="save the best and the last checkpoints")
    arg("--seed", type=int, default=1)
    arg("--ckpt_path", default=None, help="checkpoint to resume training from or to evaluate")
    arg("--resume_training", action="store_true", help="resume from <results>/checkpoints/last.ckpt")
    arg("--patience", type=int, default=3, help="early-stopping patience in epochs")
    arg("--lr_patience", type=int, default=2, help="patience of the plateau scheduler")
    arg("--batch_size", type=int, default=8)
    arg("--val_batch_size", type=int, default=8)
    arg("--train_size", type=int, default=128, help="number of synthetic training images")
    arg("--val_size", type=int, default=32, help="number of synthetic validation (and test) images")
    arg("--steps", nargs="+", type=int, default=[2, 4], help="milestones of the multistep scheduler")
    arg("--profile", action="store_true", help="profile with HPUProfiler")
    arg("--profile_steps", default="2:3", help="first:last steps to trace")
    arg("--momentum", type=float, default=0.99)
    arg("--weight_decay", type=float, default=0.0001)
    arg("--factor", type=float, default=0.3, help="factor of the multistep and plateau schedulers")
    arg("--min_epochs", type=int, default=2)
    arg("--max_epochs", type=int, default=4)
    arg("--warmup", type=int, default=2, help="batches before throughput is measured")
    arg("--norm", choices=["instance", "batch"], default="instance", help="normalization layer")
    arg("--run_lazy_mode", action="store_true", help="mark steps for lazy mode (needs PT_HPU_LAZY_MODE=1)")
    arg("--bucket_cap_mb", type=int, default=130, help="DDP gradient bucket size in MB")
    arg("--scheduler", choices=["none", "multistep", "cosine", "plateau"], default="none")
    arg("--optimizer", choices=["sgd", "adam", "radam", "adamw", "fusedadamw"], default="adamw")
    arg("--train_batches", type=int, default=0, help="training batches per epoch (0: all)")
    arg("--test_batches", type=int, default=0, help="validation and test batches (0: all)")
    arg("--progress_bar_refresh_rate", type=int, default=25)
    return parser.parse_args()


def main() -> None:
    ptlrun(get_main_args())


if __name__ == "__main__":
    main()
