"""lightning-habana's ``examples/pytorch/hpu_graphs.py``, reduced: a LightningModule trained (``fit``) or tested with
HPU graphs in the ways Gaudi's documentation shows, three steps each (``fast_dev_run=3``), batches of 200:

* ``train --mode``: ``capture_and_replay`` (manual optimization: an eager warm-up step, a step captured with
  ``htcore.hpu.graph(HPUGraph())``, replays after), ``make_graphed_callables`` (the model moved to the HPU and passed
  to ``htcore.hpu.make_graphed_callables`` with a sample batch), ``modulecacher``
  (``htcore.hpu.ModuleCacher(max_graphs=10)(model=..., inplace=True)``);
* ``inference --mode``: ``capture_and_replay`` (``capture_begin``/``capture_end`` at the first test batch, replays
  after), ``wrap_in_hpu_graph`` (``htcore.hpu.wrap_in_hpu_graph(model, asynchronous=False,
  disable_tensor_cache=True)``);
* ``dynamicity --mode``: ``dynamic_control_flow`` (a random branch between two ``ModuleCacher`` modules),
  ``dynamic_ops`` (a data-dependent op between ``htcore.mark_step()`` calls, outside the cached modules).

HPU graphs are a lazy-mode feature: lightning-habana's CI ran this example on Gaudi software 1.18, whose default was
lazy mode; run it with ``PT_HPU_LAZY_MODE=1`` on current software. Only the imports of ``lightning_habana`` changed
and the data (generated images in place of ``MNISTDataModule``'s download). Added for the tests: the run counts the
graphs captured and replayed, the model writes down what its steps saw, and one report line per mode.
"""

import argparse
import random

import habana_frameworks.torch.core as htcore
import torch
import torch.nn as nn
import torch.nn.functional as f
from _support import DigitsDataModule, counting_hpu_graphs, report
from lightning_utilities import module_available

if module_available("lightning"):
    from lightning.pytorch import LightningModule, Trainer, seed_everything
else:
    from pytorch_lightning import LightningModule, Trainer, seed_everything

from pytorch_lightning.accelerators import HPUAccelerator
from pytorch_lightning.strategies import HPUDDPStrategy, SingleHPUStrategy

BATCH = 200


def parse_args():
    parser = argparse.ArgumentParser(description="lightning-habana's HPU graphs example, reduced")
    parser.add_argument("-v", "--verbose", action="store_true", default=False)
    run_types = parser.add_subparsers(dest="run_type", help="what to run with HPU graphs")
    train = run_types.add_parser("train", help="training")
    train.add_argument("--mode", nargs="+", choices=["capture_and_replay", "make_graphed_callables", "modulecacher"])
    inference = run_types.add_parser("inference", help="inference")
    inference.add_argument("--mode", nargs="+", choices=["capture_and_replay", "wrap_in_hpu_graph"])
    dynamicity = run_types.add_parser("dynamicity", help="models with dynamic control flow or dynamic ops")
    dynamicity.add_argument("--mode", nargs="+", choices=["dynamic_control_flow", "dynamic_ops"])
    return parser.parse_args()


def weights_sum(module):
    return sum(parameter.detach().float().sum().item() for parameter in module.parameters())


class NetHPUGraphs(LightningModule):
    def __init__(self, mode=None, batch_size=None):
        super().__init__()
        self.fc1 = nn.Linear(784, 128)
        self.fc2 = nn.Linear(128, 10)
        self.dropout = nn.Dropout(0.5)
        self.mode = mode
        self.observed = {"losses": [], "weights_changed": [], "replay_matches_eager": []}

        if mode in ("dynamic_ops", "dynamic_control_flow"):
            # the graph-friendly parts in HPU graphs of their own, the dynamic part between them runs eagerly
            self.module1 = NetHPUGraphs()
            self.module2 = nn.Identity()
            htcore.hpu.ModuleCacher(max_graphs=10)(model=self.module1, inplace=True)
            htcore.hpu.ModuleCacher(max_graphs=10)(model=self.module2, inplace=True)
            if mode == "dynamic_control_flow":
                self.module3 = nn.ReLU()
                htcore.hpu.ModuleCacher(max_graphs=10)(model=self.module3, inplace=True)
            self.automatic_optimization = False
            self.training_step = (
                self.dynamic_ops_training_step if mode == "dynamic_ops" else self.dynamic_control_flow_training_step
            )
        elif mode == "capture_and_replay":
            self.g = htcore.hpu.HPUGraph()
            self.automatic_optimization = False
            self.training_step = self.train_with_capture_and_replay
            # the captured work reads and writes these tensors: new batches are copied into them
            self.static_input = torch.randn(batch_size, 1, 28, 28, device="hpu")
            self.static_target = torch.randint(0, 10, (batch_size,), device="hpu")
            self.static_y_pred = torch.randint(0, 10, (batch_size,), device="hpu")
            self.static_loss = None
        else:
            self.training_step = self.training_step_automatic

    def forward(self, x):
        x = torch.flatten(x, 1)
        x = f.relu(self.fc1(x))
        x = self.fc2(self.dropout(x))
        x = torch.mm(x, torch.eye(x.shape[1], device=x.device, dtype=x.dtype))
        return f.log_softmax(x, dim=1)

    def training_step_automatic(self, batch, batch_idx):
        x, y = batch
        return self._recorded(f.cross_entropy(self.forward(x), y), x)

    def _recorded(self, loss, data):
        """The step's loss, logged and recorded with the device of its batch."""
        self.log("train_loss", loss)
        self.observed["losses"].append(loss.item())
        self.observed["train_device"] = str(data.device)
        return loss

    def train_with_capture_and_replay(self, batch, batch_idx):
        optimizer = self.optimizers()
        first_epoch = self.current_epoch == 0
        if batch_idx == 0 and first_epoch:  # warm-up, eagerly
            optimizer.zero_grad(set_to_none=True)
            loss = f.cross_entropy(self.forward(self.static_input), self.static_target)
            loss.backward()
            optimizer.step()
            self.observed["losses"].append(loss.item())
            return loss
        if batch_idx == 1 and first_epoch:  # capture: the block runs once and is recorded
            optimizer.zero_grad(set_to_none=True)
            with htcore.hpu.graph(self.g):
                prediction = self(self.static_input)
                self.static_loss = f.cross_entropy(prediction, self.static_target)
                self.static_loss.backward()
                optimizer.step()
            self.observed["losses"].append(self.static_loss.item())
            return self.static_loss
        # replay on the new batch, copied into the captured input tensors
        data, target = batch
        self.static_input.copy_(data)
        self.static_target.copy_(target)
        self.g.replay()
        return self._recorded(self.static_loss, data)

    def dynamic_ops_training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        data, target = batch
        optimizer.zero_grad(set_to_none=True)
        out = self.module1(torch.flatten(data, 1))
        htcore.mark_step()
        out = out[torch.where(out < 0)]  # its shape depends on the data: not in a graph
        htcore.mark_step()
        out = self.module2(out)
        loss = f.cross_entropy(torch.reshape(out, (BATCH, 10)), target)
        loss.backward()
        optimizer.step()
        return self._recorded(loss, data)

    def dynamic_control_flow_training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        data, target = batch
        optimizer.zero_grad(set_to_none=True)
        out = self.module1(torch.flatten(data, 1))
        out = self.module2(out) if random.random() > 0.5 else self.module3(out)
        loss = f.cross_entropy(torch.reshape(out, (BATCH, 10)), target)
        loss.backward()
        optimizer.step()
        return self._recorded(loss, data)

    def on_train_batch_start(self, batch, batch_idx):
        self._weights_before = weights_sum(self)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.observed["weights_changed"].append(weights_sum(self) != self._weights_before)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        acc = self.accuracy(self(x), y)
        self.log("val_acc", acc)

    def test_step(self, batch, batch_idx):
        x, y = batch
        if self.mode == "capture_and_replay":
            if batch_idx == 0:
                self.g.capture_begin()
                prediction = self.forward(self.static_input)
                self.static_loss = f.cross_entropy(prediction, self.static_target)
                self.g.capture_end()
            else:
                htcore.mark_step()
                self.static_input.copy_(x)
                self.static_target.copy_(y)
                self.g.replay()
                # the replay computed the loss of this batch
                eager = f.cross_entropy(self.forward(x), y)
                self.observed["replay_matches_eager"].append(torch.allclose(eager, self.static_loss))
            acc = self.accuracy(None, y, self.static_y_pred)
        else:
            logits = self.forward(x)
            if self.mode == "wrap_in_hpu_graph":
                eager = self.forward(x, bypass_hpu_graphs=True)
                self.observed["replay_matches_eager"].append(torch.allclose(eager, logits))
            acc = self.accuracy(logits, y)
        self.observed["test_device"] = str(x.device)
        self.log("test_acc", acc)

    @staticmethod
    def accuracy(logits, y, pred=None):
        if pred is None:
            pred = torch.argmax(logits, -1)
        return torch.sum(torch.eq(pred, y).to(torch.float32)) / len(y)

    def configure_optimizers(self):
        return torch.optim.Adadelta(self.parameters(), lr=0.1)


def train_model(model, data_module, hpus=1, mode="fit"):
    strategy = HPUDDPStrategy() if hpus > 1 else SingleHPUStrategy()
    trainer = Trainer(accelerator=HPUAccelerator(), devices=hpus, strategy=strategy, max_epochs=1, fast_dev_run=3)
    print(f"starting {mode}", flush=True)
    getattr(trainer, mode)(model, data_module)
    return trainer


def get_model(run_type, mode):
    if mode is None:
        return NetHPUGraphs(mode=mode)
    if run_type == "train":
        if mode == "capture_and_replay":
            return NetHPUGraphs(mode=mode, batch_size=BATCH)
        if mode == "make_graphed_callables":
            model = NetHPUGraphs(mode=mode).to(torch.device("hpu"))
            sample = torch.randn(BATCH, 1, 28, 28, device="hpu")
            return htcore.hpu.make_graphed_callables(model, (sample,))
        if mode == "modulecacher":
            return htcore.hpu.ModuleCacher(max_graphs=10)(model=NetHPUGraphs(mode=mode), inplace=True)
    elif run_type == "inference":
        if mode == "capture_and_replay":
            return NetHPUGraphs(mode=mode, batch_size=BATCH)
        if mode == "wrap_in_hpu_graph":
            model = NetHPUGraphs(mode=mode).to(torch.device("hpu"))
            return htcore.hpu.wrap_in_hpu_graph(model, asynchronous=False, disable_tensor_cache=True)
    elif run_type == "dynamicity":
        return NetHPUGraphs(mode=mode)
    return None


if __name__ == "__main__":
    args = parse_args()
    if args.verbose:
        print(f"arguments: {args}", flush=True)
    stage = {"train": "fit", "dynamicity": "fit", "inference": "test"}.get(args.run_type)
    for mode in args.mode:
        if args.verbose:
            print(f"mode {mode}", flush=True)
        seed_everything(42)
        with counting_hpu_graphs() as graphs:
            model = get_model(args.run_type, mode)
            assert model is not None
            trainer = train_model(model, DigitsDataModule(batch_size=BATCH), hpus=1, mode=stage)
        metrics = {name: value.item() for name, value in trainer.logged_metrics.items()}
        print(f"{metrics}", flush=True)
        report(
            example="hpu_graphs",
            run_type=args.run_type,
            mode=mode,
            lazy=htcore.is_lazy(),
            metrics=metrics,
            accelerator=type(trainer.accelerator).__name__,
            num_devices=trainer.num_devices,
            **graphs,
            **model.observed,
        )
