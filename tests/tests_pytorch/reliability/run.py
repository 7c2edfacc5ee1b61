"""Runs for the reliability tests, one scenario per sub-command, each in a process of its own that the tests may kill.

``train``      fit a small model with dropout, AdamW and a per-step LR schedule, a checkpoint every ``--every`` steps;
               ``--kill-at S`` SIGKILLs the whole process group (every rank) after step S, ``--resume`` continues from
               ``last.ckpt``. Each rank writes its final weights to ``final-rank<r>.pt``.
``save``       save ``last.ckpt`` of a model with a large buffer at steps 1 and 2; ``--slow`` stalls the second save
               halfway through writing (the test kills it there).
``fail``       at step 3 rank ``--failing-rank`` raises in ``training_step``, rank ``--stuck-rank`` hangs there; without
               either, trains until stopped. Each rank says how and at which step it stopped.
``oom``        a training step allocates more than the virtual device has.
``handled``    at step 2 every rank (``--failing-rank -1``) or rank ``--failing-rank`` alone raises a ``ValueError`` in
               ``training_step``, which the script catches; then a second ``fit``, of another Trainer, trains 4 steps.
               The other ranks of a lone failure carry on into the step's collectives.
``fabric``     the same with Fabric's loop: at step 2 every rank or rank ``--failing-rank`` alone raises; with
               ``--handle`` the script catches it and trains 4 more steps.
Each rank says what it handled, the parameter sum it trained to, and that it finished.
"""

import os
import signal
import sys
import time
from argparse import ArgumentParser

import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

import pytorch_lightning as pl

FEATURES, SAMPLES, BATCH = 8, 64, 4


def _say(line: str) -> None:
    """One line in one write, so the lines of ranks sharing the output do not interleave."""
    os.write(sys.stdout.fileno(), f"{line}\n".encode())


class Points(Dataset):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(SAMPLES, FEATURES, generator=generator)
        self.y = torch.randn(SAMPLES, 1, generator=generator)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int):
        return self.x[index], self.y[index]


class EpochShuffle(Sampler):
    """A different order each epoch, fixed by the epoch number (as ``DistributedSampler`` does)."""

    def __init__(self, size: int) -> None:
        self.size, self.epoch = size, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return iter(torch.randperm(self.size, generator=torch.Generator().manual_seed(self.epoch)).tolist())

    def __len__(self) -> int:
        return self.size


class ResumableLoader(DataLoader):
    """A loader that can resume mid-epoch, as Lightning asks of loaders (``state_dict`` / ``load_state_dict``).

    The position is the number of batches training has taken (the model counts them), not the number this loader has
    yielded: Lightning fetches one batch ahead.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.taken, self._skip = 0, 0

    def __iter__(self):
        skip, self._skip = self._skip, 0
        self.taken = skip
        for index, batch in enumerate(super().__iter__()):
            if index >= skip:
                yield batch

    def state_dict(self) -> dict:
        return {"taken": self.taken}

    def load_state_dict(self, state: dict) -> None:
        self._skip = state["taken"] % len(self)  # a whole epoch taken: the next one starts from its beginning


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Dropout(0.25), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def on_train_start(self) -> None:
        self.started_at = self.trainer.global_step

    def on_train_batch_start(self, batch, batch_idx) -> None:
        self.trainer.train_dataloader.taken += 1

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.7)
        return [optimizer], [{"scheduler": scheduler, "interval": "step"}]

    def train_dataloader(self) -> DataLoader:
        data = Points()
        # a generator of its own, so creating the iterator draws nothing from the global one
        return ResumableLoader(
            data, batch_size=BATCH, sampler=EpochShuffle(len(data)), generator=torch.Generator().manual_seed(2)
        )


class RandomStates(Callback):
    """Keeps the random number generators in checkpoints (Lightning does not) and restores them before the next step.

    The HPU generator is separate from the CPU one on Gaudi (the virtual device draws from the CPU's): save both.
    """

    def __init__(self) -> None:
        self._restored = None

    def state_dict(self) -> dict:
        return {"cpu": torch.get_rng_state(), "hpu": torch.hpu.get_rng_state()}

    def load_state_dict(self, state: dict) -> None:
        self._restored = state

    def on_train_batch_start(self, *args) -> None:
        if self._restored is not None:
            torch.set_rng_state(self._restored["cpu"])
            torch.hpu.set_rng_state(self._restored["hpu"])
            self._restored = None


class KillAt(Callback):
    """SIGKILL every process of the run after step ``step``, as a node failure or a preemption would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step and trainer.is_global_zero:
            os.killpg(os.getpgrp(), signal.SIGKILL)


def _trainer(args, **kwargs) -> pl.Trainer:
    return pl.Trainer(
        accelerator="hpu",
        devices=args.devices,
        strategy=args.strategy,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        **kwargs,
    )


def train(args) -> None:
    if args.kill_at and "LOCAL_RANK" not in os.environ and os.getpgrp() != os.getpid():
        raise SystemExit("--kill-at kills the process group: start the run as its leader (setsid)")
    pl.seed_everything(0)
    callbacks = [
        RandomStates(),
        ModelCheckpoint(dirpath=args.dir, every_n_train_steps=args.every, save_top_k=-1, save_last=True),
    ]
    if args.kill_at:
        callbacks.append(KillAt(args.kill_at))
    trainer = _trainer(args, max_steps=args.steps, callbacks=callbacks)
    model = Net()
    trainer.fit(model, ckpt_path="last" if args.resume else None)
    weights = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    torch.save(
        {"weights": weights, "global_step": trainer.global_step, "started_at": model.started_at},
        os.path.join(args.dir, f"final-rank{trainer.global_rank}.pt"),
    )


class Large(pl.LightningModule):
    """A model with a large buffer, so a checkpoint takes a while to write."""

    def __init__(self, megabytes: int, slow: bool) -> None:
        super().__init__()
        self.layer = nn.Linear(FEATURES, 1)
        self.register_buffer("ballast", torch.zeros(megabytes * 2**18))
        self.slow = slow

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Points(), batch_size=BATCH)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.slow and self.trainer.global_step == 2:
            checkpoint["stall"] = Stall()


class Stall:
    """Pickling it reports the save under way, then stalls it."""

    def __reduce__(self):
        _say("stalled inside save_checkpoint")
        time.sleep(600)
        return (Stall, ())


class ReportSaves(Callback):
    def on_train_batch_end(self, trainer, *args) -> None:
        # checkpoint callbacks run after this one: the save of the previous step is complete
        if trainer.global_step > 1:
            _say(f"saved step {trainer.global_step - 1}")


def save(args) -> None:
    checkpoint = ModelCheckpoint(dirpath=args.dir, every_n_train_steps=1, save_top_k=0, save_last=True)
    trainer = _trainer(args, max_steps=3, callbacks=[ReportSaves(), checkpoint])
    trainer.fit(Large(args.megabytes, args.slow))


class FailingNet(Net):
    """At step 3, rank ``failing_rank`` raises and rank ``stuck_rank`` hangs outside any collective (a stuck file
    system, a deadlocked loader worker); the other ranks carry on into the next collective."""

    def __init__(self, failing_rank: int, stuck_rank: int) -> None:
        super().__init__()
        self.failing_rank, self.stuck_rank = failing_rank, stuck_rank

    def training_step(self, batch, batch_idx):
        if self.global_step == 2:
            _say(f"rank {self.global_rank} (pid {os.getpid()}) at step 2")
        if self.global_step == 3 and self.global_rank == self.failing_rank:
            raise RuntimeError(f"injected failure on rank {self.global_rank}")
        if self.global_step == 3 and self.global_rank == self.stuck_rank:
            time.sleep(3600)
        if self.global_step > 2:
            time.sleep(0.1)  # slow steps, so that a run waiting for its signal leaves the CPU to others
        return super().training_step(batch, batch_idx)


class ReportStop(Callback):
    """Says how and at which step each rank stopped training."""

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        _say(f"rank {trainer.global_rank} stopped by {type(exception).__name__} at step {trainer.global_step}")


def fail(args) -> None:
    trainer = _trainer(args, max_steps=10**6, enable_checkpointing=False, callbacks=[ReportStop()])
    trainer.fit(FailingNet(args.failing_rank, args.stuck_rank))


class Hungry(Net):
    def training_step(self, batch, batch_idx):
        # activations far larger than the device: 256 MiB on a device of VIRTUAL_HPU_MEMORY_MB
        activations = batch[0].new_empty(64, 2**20)
        return super().training_step(batch, batch_idx) + activations.sum() * 0


def oom(args) -> None:
    trainer = _trainer(args, max_steps=2, enable_checkpointing=False)
    trainer.fit(Hungry())


class RaisesAtStep2(Net):
    def __init__(self, failing_rank: int) -> None:
        super().__init__()
        self.failing_rank = failing_rank

    def training_step(self, batch, batch_idx):
        if self.global_step == 2:
            _say(f"rank {self.global_rank} (pid {os.getpid()}) at step 2")
            if self.failing_rank in (-1, self.global_rank):
                raise ValueError(f"bad batch on rank {self.global_rank}")
        return super().training_step(batch, batch_idx)


def _parameter_sum(model: nn.Module) -> str:
    return repr(sum(parameter.detach().double().sum().item() for parameter in model.parameters()))


def handled(args) -> None:
    pl.seed_everything(0)
    trainer = _trainer(args, max_steps=10**6, enable_checkpointing=False)
    try:
        trainer.fit(RaisesAtStep2(args.failing_rank))
    except ValueError as error:
        _say(f"rank {trainer.global_rank} handled {error!r}")
    again = _trainer(args, max_steps=4, enable_checkpointing=False)
    model = Net()
    again.fit(model)
    _say(f"rank {again.global_rank} trained again to step {again.global_step}: {_parameter_sum(model)}")
    _say(f"rank {again.global_rank} finished")


def fabric(args) -> None:
    from lightning_fabric import Fabric

    fabric = Fabric(accelerator="hpu", devices=args.devices, strategy=args.strategy)
    fabric.launch()
    fabric.seed_everything(0)
    net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))
    model, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    data = Points()

    def train(steps: range, failing: bool) -> None:
        for step in steps:
            if step == 2:
                _say(f"rank {fabric.global_rank} (pid {os.getpid()}) at step 2")
                if failing:
                    raise ValueError(f"bad batch on rank {fabric.global_rank}")
            x, y = (tensor.to(fabric.device) for tensor in (data.x[:BATCH], data.y[:BATCH]))
            fabric.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()

    failing = args.failing_rank in (-1, fabric.global_rank)
    if not args.handle:
        train(range(10**6), failing)  # until a failure ends it
        return
    try:
        train(range(4), failing)
    except ValueError as error:
        _say(f"rank {fabric.global_rank} handled {error!r}")
    train(range(4, 8), failing=False)
    loss = fabric.all_reduce(torch.tensor(float(fabric.global_rank), device=fabric.device), reduce_op="sum")
    _say(f"rank {fabric.global_rank} trained again to step 8: {_parameter_sum(net)}, all-reduced {loss.item()}")
    _say(f"rank {fabric.global_rank} finished")


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("scenario", choices=["train", "save", "fail", "oom", "handled", "fabric"])
    parser.add_argument("--dir", default=".")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--megabytes", type=int, default=128)
    parser.add_argument("--slow", action="store_true")
    parser.add_argument("--failing-rank", type=int, default=-1)
    parser.add_argument("--stuck-rank", type=int, default=-1)
    parser.add_argument("--handle", action="store_true")
    args = parser.parse_args()
    scenarios = {"train": train, "save": save, "fail": fail, "oom": oom, "handled": handled, "fabric": fabric}
    scenarios[args.scenario](args)


if __name__ == "__main__":
    sys.exit(main())
