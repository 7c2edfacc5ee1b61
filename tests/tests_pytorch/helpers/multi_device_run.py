"""Trainer programs in the shape users write for several devices, for ``tests_pytorch/multi_device``.

Started directly, Lightning starts the other rank (``Trainer(devices=2)`` re-runs this script). Each rank saves what it
observed in ``<out>/rank<N>.pt``. ``--accelerator cpu`` runs the same program with upstream's CPU DDP, the reference.

Scenarios (``--scenario``):

- ``train``: a ``fit`` with manual optimization over two optimizers, without the distributed sampler; then a ``fit``
  with collectives in a hook (``all_gather`` with gradients too), ``sync_dist`` logging, ``rank_zero_only``,
  EarlyStopping on a metric that differs per rank, ModelCheckpoint, LearningRateMonitor, a CSV logger and the progress
  bar, gradient accumulation over the distributed sampler; a third ``fit``, of another Trainer, resumed from
  ``last.ckpt``; then ``validate``, ``test`` and ``predict`` (returned, and written by a ``BasePredictionWriter``) with
  the second Trainer, and a checkpoint it saves, loaded on every rank.
- ``datamodule``: ``fit`` and ``test`` with a DataModule that downloads in ``prepare_data`` and splits in ``setup``.
- ``validate_fit`` / ``test_fit_predict``: evaluation before training in one process, on one Trainer.
- ``compiled``: ``fit`` and ``validate`` of ``torch.compile(model)`` with torch's default backend.
- ``sync_batchnorm``: ``fit`` of a model with batch norm, ``sync_batchnorm=True``.
"""

import os
from argparse import ArgumentParser
from pathlib import Path

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import pytorch_lightning as pl
from pytorch_lightning.callbacks import BasePredictionWriter, EarlyStopping, LearningRateMonitor, ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.utilities import rank_zero_only

ROWS, FEATURES = 16, 8


class Rows(Dataset):
    """A fixed regression data set whose items carry their index, so that each rank can say which rows it saw."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(11)
        self.x = torch.randn(ROWS, FEATURES, generator=generator)
        self.y = self.x @ torch.linspace(-1, 1, FEATURES).unsqueeze(1) + 0.1 * torch.randn(ROWS, 1, generator=generator)

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, index: int):
        return index, self.x[index], self.y[index]


def host(value):
    """Tensors (also in dicts and lists) on the host, to be saved and compared with another run."""
    return apply_to_collection(value, torch.Tensor, lambda tensor: tensor.detach().cpu().clone())


class Regressor(pl.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))
        self.seen: dict = {"train": [], "val": []}
        self.collectives: dict = {}

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        index, x, y = batch
        self.seen["train"] += index.tolist()
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, sync_dist=True, on_step=True, on_epoch=True, prog_bar=True)
        self.log("rank_sum", float(self.global_rank + 1), sync_dist=True, reduce_fx="sum")
        self.log("rank_max", float(self.global_rank), sync_dist=True, reduce_fx="max")
        return loss

    def validation_step(self, batch, batch_idx):
        index, x, y = batch
        self.seen["val"] += index.tolist()
        self.log("val_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)
        # not synchronised on purpose: rank 0 never improves, rank 1 always does; EarlyStopping must agree anyway
        self.log("rank_metric", 1.0 if self.global_rank == 0 else 1.0 / (self.current_epoch + 1))

    def test_step(self, batch, batch_idx):
        _, x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)
        self.log("test_rank_min", float(self.global_rank), sync_dist=True, reduce_fx="min")

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        index, x, _ = batch
        return index, self(x)

    def on_train_start(self) -> None:
        strategy, rank = self.trainer.strategy, self.global_rank
        gathered_objects = [None] * self.trainer.world_size
        torch.distributed.all_gather_object(gathered_objects, {"rank": rank})
        strategy.barrier("before the collectives")
        # gathered with the autograd graph kept (contrastive losses): each rank's input gets every rank's gradient
        differentiable = torch.tensor([rank + 1.0], device=self.device, requires_grad=True)
        (
            self.all_gather(differentiable, sync_grads=True) * torch.tensor([[1.0], [2.0]], device=self.device)
        ).sum().backward()
        self.collectives = host(
            {
                "device": str(self.device),
                "all_gather": self.all_gather(torch.tensor([rank, 10 + rank], device=self.device)),
                "all_gather_sync_grads": differentiable.grad,
                "all_gather_dict": self.all_gather({"half": torch.tensor(rank + 0.5, device=self.device)}),
                "broadcast_object": strategy.broadcast({"from": rank, "items": [rank] * 3}),
                "broadcast_tensor": strategy.broadcast(torch.tensor([rank + 5.0], device=self.device)),
                "all_gather_object": gathered_objects,
                "sum_long": strategy.reduce(torch.tensor(rank + 1, device=self.device), reduce_op="sum"),
                "max_half": strategy.reduce(torch.tensor(rank + 1.0, device=self.device).half(), reduce_op="max"),
                "mean_float": strategy.reduce(torch.tensor(rank + 1.0, device=self.device), reduce_op="mean"),
                "any": strategy.reduce_boolean_decision(rank == 0, all=False),
                "all": strategy.reduce_boolean_decision(rank == 0, all=True),
            }
        )
        self.write_once(Path(self.trainer.default_root_dir) / "rank_zero_only.txt")

    @staticmethod
    @rank_zero_only
    def write_once(path: Path) -> None:
        with open(path, "a") as file:
            file.write("written\n")

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]

    def train_dataloader(self):
        return DataLoader(Rows(), batch_size=2)

    def val_dataloader(self):
        return DataLoader(Rows(), batch_size=2)

    def test_dataloader(self):
        return DataLoader(Rows(), batch_size=4)


class Adversarial(pl.LightningModule):
    """Manual optimization over two optimizers, each stepping every second batch (accumulating gradients)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(1)
        self.generator = nn.Linear(FEATURES, FEATURES)
        self.critic = nn.Linear(FEATURES, 1)
        self.seen: list = []

    def training_step(self, batch, batch_idx):
        index, x, _ = batch
        self.seen += index.tolist()
        generator_optimizer, critic_optimizer = self.optimizers()
        step = batch_idx % 2 == 1

        self.toggle_optimizer(critic_optimizer)
        critic_loss = self.critic(x).mean() - self.critic(self.generator(x).detach()).mean()
        self.manual_backward(critic_loss / 2)
        if step:
            critic_optimizer.step()
            critic_optimizer.zero_grad()
        self.untoggle_optimizer(critic_optimizer)

        self.toggle_optimizer(generator_optimizer)
        generator_loss = -self.critic(self.generator(x)).mean()
        self.manual_backward(generator_loss / 2)
        if step:
            self.clip_gradients(generator_optimizer, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
            generator_optimizer.step()
            generator_optimizer.zero_grad()
        self.untoggle_optimizer(generator_optimizer)
        self.log_dict({"critic_loss": critic_loss, "generator_loss": generator_loss}, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.generator.parameters(), lr=0.1), torch.optim.Adam(self.critic.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(Rows(), batch_size=4)


class Writer(BasePredictionWriter):
    """Each rank writes its predictions and the indices of their rows at the end of ``predict``."""

    def __init__(self, directory: Path) -> None:
        super().__init__(write_interval="epoch")
        self.directory = directory

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        self.directory.mkdir(exist_ok=True)
        torch.save(
            {"predictions": host(predictions), "batch_indices": batch_indices},
            self.directory / f"rank{trainer.global_rank}.pt",
        )


class Download(pl.LightningDataModule):
    """The tutorial DataModule: ``prepare_data`` writes the data set once, ``setup`` reads it on every rank."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.file = directory / "dataset.pt"
        self.prepared = 0

    def prepare_data(self) -> None:
        self.prepared += 1
        dataset = Rows()
        torch.save((dataset.x, dataset.y), self.file)

    def setup(self, stage: str) -> None:
        self.x, self.y = torch.load(self.file)

    def train_dataloader(self):
        return DataLoader(list(zip(range(ROWS), self.x, self.y)), batch_size=2)

    test_dataloader = train_dataloader


class Normalised(Regressor):
    """Batch norm between the layers; ``batch_size`` rows per step on each rank."""

    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(FEATURES, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))

    def on_train_start(self) -> None:
        # Lightning turns the layer back into batch norm after fitting
        self.norm_in_training = type(self.net[1]).__name__

    def train_dataloader(self):
        # in order, so that one process on the union of the ranks' batches sees the same rows at each step
        sampler = DistributedSampler(Rows(), shuffle=False) if self.trainer.world_size > 1 else None
        return DataLoader(Rows(), batch_size=self.batch_size, sampler=sampler)


def trainer(args, **flags) -> pl.Trainer:
    options = {
        "accelerator": args.accelerator,
        "devices": 2,
        "strategy": "ddp" if args.accelerator == "cpu" else "hpu_parallel",
        "default_root_dir": args.out,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    return pl.Trainer(**{**options, **flags})


def weights(model: nn.Module) -> dict:
    return {name: tensor.detach().cpu().clone() for name, tensor in model.state_dict().items()}


def metrics(values: dict) -> dict:
    return {name: float(value) for name, value in values.items()}


def train(args) -> dict:
    out = Path(args.out)
    adversarial = Adversarial()
    # toggling leaves the other optimizer's parameters without gradients: DDP must be told, by the name CUDA scripts use
    strategy = "ddp_find_unused_parameters_true"
    manual = trainer(args, max_epochs=2, use_distributed_sampler=False, strategy=strategy)
    manual.fit(adversarial)
    result = {
        "manual": {
            "seen": adversarial.seen,
            "global_step": manual.global_step,
            "metrics": metrics(manual.callback_metrics),
            "weights": weights(adversarial),
        }
    }

    stopping = EarlyStopping(monitor="rank_metric", patience=1, mode="min")
    checkpoints = ModelCheckpoint(
        dirpath=out / "checkpoints", filename="{epoch}", monitor="val_loss", save_top_k=2, save_last=True
    )
    fitting = trainer(
        args,
        max_epochs=6,
        accumulate_grad_batches=2,
        log_every_n_steps=1,
        logger=CSVLogger(out, name="logs", version=0),
        # what users leave on: the progress bar (the HPU one by default), the model summary
        enable_progress_bar=True,
        enable_model_summary=True,
        enable_checkpointing=True,
        callbacks=[stopping, checkpoints, LearningRateMonitor(logging_interval="epoch"), Writer(out / "written")],
    )
    model = Regressor()
    fitting.fit(model)
    result |= {
        "collectives": model.collectives,
        "seen": model.seen,
        "fit_metrics": metrics(fitting.callback_metrics),
        "epoch": fitting.current_epoch,
        "global_step": fitting.global_step,
        "stopped_epoch": stopping.stopped_epoch,
        "checkpoints": sorted(path.name for path in (out / "checkpoints").iterdir()),
        "best_model_path": Path(checkpoints.best_model_path).name,
        "best_model_score": float(checkpoints.best_model_score),
        "weights": weights(model),
    }
    # a second fit in the same process, another Trainer resuming from the last checkpoint of the first
    resumed_model = Regressor()
    resumed = trainer(args, max_epochs=3, accumulate_grad_batches=2)
    resumed.fit(resumed_model, ckpt_path=out / "checkpoints" / "last.ckpt")
    result["resumed"] = {"global_step": resumed.global_step, "weights": weights(resumed_model)}

    result["validate"] = fitting.validate(model)
    result["test"] = fitting.test(model)
    predictions = fitting.predict(model, DataLoader(Rows(), batch_size=3), return_predictions=True)
    result["predictions"] = host(predictions)

    saved = out / "saved.ckpt"
    fitting.save_checkpoint(saved)
    result["loaded_weights"] = weights(Regressor.load_from_checkpoint(saved))

    return result


def datamodule(args) -> dict:
    data = Download(Path(args.out))
    fitting = trainer(args, max_epochs=1)
    model = Regressor()
    fitting.fit(model, datamodule=data)
    return {"prepared": data.prepared, "test": fitting.test(model, datamodule=data), "weights": weights(model)}


def validate_fit(args) -> dict:
    model = Regressor()
    run = trainer(args, fast_dev_run=True)
    validated = run.validate(model)
    run.fit(model)
    return {"validate": validated, "global_step": run.global_step, "weights": weights(model)}


def test_fit_predict(args) -> dict:
    model = Regressor()
    run = trainer(args, fast_dev_run=True)
    tested = run.test(model)
    run.fit(model)
    predictions = run.predict(model, DataLoader(Rows(), batch_size=8))
    return {"test": tested, "global_step": run.global_step, "predictions": host(predictions), "weights": weights(model)}


def compiled(args) -> dict:
    model = Regressor()
    run = trainer(args, max_epochs=1)
    run.fit(torch.compile(model))
    return {"validate": run.validate(model), "global_step": run.global_step, "weights": weights(model)}


def sync_batchnorm(args) -> dict:
    model = Normalised(batch_size=2)
    run = trainer(args, max_epochs=2, sync_batchnorm=True, limit_val_batches=0, use_distributed_sampler=False)
    run.fit(model)
    return {"norm": model.norm_in_training, "weights": weights(model)}


SCENARIOS = {
    function.__name__: function
    for function in (train, datamodule, validate_fit, test_fit_predict, compiled, sync_batchnorm)
}


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    parser.add_argument("--accelerator", default="hpu", choices=("hpu", "cpu"))
    args = parser.parse_args()
    result = SCENARIOS[args.scenario](args)
    torch.save(result, os.path.join(args.out, f"rank{rank_zero_only.rank}.pt"))


if __name__ == "__main__":
    main()
