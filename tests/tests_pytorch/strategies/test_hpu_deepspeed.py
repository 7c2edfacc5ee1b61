"""DeepSpeed on HPUs: the configurations of the reference page, names, configs, precision and bad inputs."""

import json
import logging

import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.plugins import DeepSpeedPrecision
from lightning.pytorch.strategies import DeepSpeedStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pytorch_lightning as pl
from pytorch_lightning.plugins import HPUDeepSpeedPrecisionPlugin
from pytorch_lightning.strategies import HPUDeepSpeedStrategy
from tests_pytorch.helpers.processes import assert_same_parameters, marked, rank_results, run_ddp, wait
from tests_pytorch.helpers.runif import VARIANT, variants

FEATURES = 32


@pytest.fixture(autouse=True)
def _isolate_deepspeed():
    """DeepSpeed keeps its process groups in module globals: undo them, so that each test starts as a fresh process
    would (the conftest undoes the deterministic algorithms DeepSpeed's HPU accelerator turns on)."""
    yield
    if torch.distributed.is_initialized():
        import deepspeed.comm

        deepspeed.comm.destroy_process_group()


class SampleModel(pl.LightningModule):
    """Two layers, the second one optionally through DeepSpeed's activation checkpointing, and the dtypes it saw."""

    def __init__(self, checkpoint_activations: bool = False, optimizer: str = "sgd") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.l1 = nn.Linear(FEATURES, FEATURES)
        self.l2 = nn.Linear(FEATURES, 2)
        self.checkpoint_activations = checkpoint_activations
        self.optimizer = optimizer
        self.activation_dtypes: set = set()
        self.partitioned_at_start = False

    def on_train_start(self):
        # ZeRO-3 partitions the parameters: outside forward each module holds an empty placeholder
        self.partitioned_at_start = all(hasattr(p, "ds_id") and p.numel() == 0 for p in self.parameters())

    def forward(self, x):
        hidden = torch.relu(self.l1(x))
        if self.checkpoint_activations:
            from deepspeed.runtime.activation_checkpointing.checkpointing import checkpoint

            return checkpoint(self.l2, hidden)
        return self.l2(hidden)

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        self.activation_dtypes.add(out.dtype)
        loss = nn.functional.cross_entropy(out.float(), y)
        self.log("train_loss", loss)
        return loss

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_acc", (self(x).argmax(-1) == y).float().mean())

    def train_dataloader(self):
        return _loader()

    def test_dataloader(self):
        return _loader()

    def configure_optimizers(self):
        if self.optimizer == "adamw":
            return torch.optim.AdamW(self.parameters(), lr=0.01)
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]


def _loader(batch_size: int = 8) -> DataLoader:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(64, FEATURES, generator=generator)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=batch_size)


def _trainer(strategy, **flags) -> pl.Trainer:
    defaults = {
        "accelerator": "hpu",
        "devices": 1,
        "max_steps": 4,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    return pl.Trainer(strategy=strategy, **{**defaults, **flags})


def _zero_optimizer(trainer: pl.Trainer) -> str:
    return type(trainer.strategy.deepspeed_engine.optimizer).__name__


# the reference page's ZeRO configurations, each with upstream's plugin as the page passes it
REFERENCE = {
    "ZeRO-1": ({"zero_optimization": True, "stage": 1}, "DeepSpeedZeroOptimizer"),
    "ZeRO-2": ({"zero_optimization": True, "stage": 2}, "DeepSpeedZeroOptimizer"),
    "ZeRO-3": ({"zero_optimization": True, "stage": 3}, "DeepSpeedZeroOptimizer_Stage3"),
    "BF16 precision": ({}, "DeepSpeedZeroOptimizer"),
}


@pytest.mark.parametrize("name", list(REFERENCE))
def test_reference_configuration(name):
    arguments, optimizer = REFERENCE[name]
    linear_before = torch.nn.functional.linear
    model = SampleModel()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = _trainer(HPUDeepSpeedStrategy(**arguments), plugins=[DeepSpeedPrecision(precision="bf16-mixed")])
    trainer.fit(model)
    assert isinstance(trainer.strategy, DeepSpeedStrategy)
    assert isinstance(trainer.precision_plugin, HPUDeepSpeedPrecisionPlugin)
    assert trainer.strategy.config["bf16"]["enabled"]
    # the ZeRO stage is applied: DeepSpeed's optimizer of that stage wraps ours, on the HPU
    assert _zero_optimizer(trainer) == optimizer
    assert trainer.strategy.deepspeed_engine.zero_optimization_stage() == arguments.get("stage", 2)
    assert trainer.strategy.root_device.type == trainer.strategy.deepspeed_engine.device.type == "hpu"
    assert model.activation_dtypes == {torch.bfloat16}
    assert model.partitioned_at_start == (arguments.get("stage") == 3)
    # ZeRO-3 replaced torch.nn.functional.linear while it ran; the process gets its own back
    assert torch.nn.functional.linear is linear_before
    if arguments.get("stage") == 3:
        trainer.test(model)
        assert torch.nn.functional.linear is linear_before
        return
    assert any(not torch.equal(b, a.detach().float().cpu()) for b, a in zip(before, model.parameters()))
    trainer.test(model)
    assert trainer.callback_metrics["test_acc"] > 0.5


def test_a_world_destroyed_with_torch_between_two_fits_leaves_nothing_behind():
    """The Trainer's advice between runs is ``torch.distributed.destroy_process_group()``; DeepSpeed keeps groups of the
    old world (upstream releases them in its own ``destroy_process_group`` only, Intel's fork never), which the next
    engine would use: "Group ... is not registered"."""
    for _ in range(2):
        model = SampleModel()
        trainer = _trainer(HPUDeepSpeedStrategy(stage=2))
        trainer.fit(model)
        assert _zero_optimizer(trainer) == "DeepSpeedZeroOptimizer"
        torch.distributed.destroy_process_group()


# compiling the CPU Adam takes minutes on a fresh machine; offloading itself is tested with torch's optimizer below
@pytest.mark.stress(reason="compiles DeepSpeed's CPU Adam (minutes on a fresh machine)")
def test_zero_offload_with_deepspeed_cpu_adam():
    """ZeRO-Offload (and the page's "ZeRO-Infinity" example, the same code): stage 2 with the optimizer on the host.

    DeepSpeed's CPU Adam is compiled on first use (minutes, then cached): the one test that needs it.
    """
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    class WithCPUAdam(SampleModel):
        def configure_optimizers(self):
            return DeepSpeedCPUAdam(self.parameters(), lr=0.01)

    model = WithCPUAdam()
    strategy = HPUDeepSpeedStrategy(zero_optimization=True, stage=2, offload_optimizer=True)
    trainer = _trainer(strategy, plugins=[DeepSpeedPrecision(precision="bf16-mixed")])
    trainer.fit(model)
    engine = trainer.strategy.deepspeed_engine
    assert engine.zero_cpu_offload()
    assert _zero_optimizer(trainer) == "DeepSpeedZeroOptimizer"
    # the fp32 master weights live on the host, the bf16 model on the HPU
    assert engine.optimizer.single_partition_of_fp32_groups[0].device.type == "cpu"
    assert engine.device.type == "hpu"
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    trainer.test(model)
    assert trainer.callback_metrics["test_acc"] > 0.5


def test_activation_checkpointing_with_cpu_checkpointing():
    model = SampleModel(checkpoint_activations=True)
    strategy = HPUDeepSpeedStrategy(zero_optimization=True, stage=3, offload_optimizer=True, cpu_checkpointing=True)
    # a plain torch optimizer on offloaded states, as on CUDA, needs DeepSpeed told so
    strategy.config["zero_force_ds_cpu_optimizer"] = False
    trainer = _trainer(strategy, plugins=[DeepSpeedPrecision(precision="bf16-mixed")])
    trainer.fit(model)
    from deepspeed.runtime.activation_checkpointing import checkpointing

    assert checkpointing.is_configured()
    assert checkpointing.CPU_CHECKPOINT
    assert trainer.strategy.deepspeed_engine.zero_offload_optimizer()
    assert model.activation_dtypes == {torch.bfloat16}


BF16_OPTIMIZER_CONFIG = {
    "train_batch_size": 8,
    "bf16": {"enabled": True},
    "fp16": {"enabled": False},
    "train_micro_batch_size_per_gpu": 2,
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": 0.02,
            "warmup_max_lr": 0.05,
            "warmup_num_steps": 4,
            "total_num_steps": 8,
            "warmup_type": "linear",
        },
    },
    "zero_allow_untested_optimizer": True,
    "zero_optimization": {"stage": 2},
}


def test_bf16_optimizer_config_with_its_scheduler():
    """The reference page's JSON config: explicit devices, 2 micro-batches of 2 accumulated per step, the config's
    scheduler driving the LightningModule's AdamW."""
    model = SampleModel(optimizer="adamw")
    model.train_dataloader = lambda: _loader(batch_size=2)
    parallel_hpus = [torch.device("hpu")]  # the page's `[torch.device("hpu")] * HPUAccelerator.auto_device_count()`
    config = {**BF16_OPTIMIZER_CONFIG, "train_batch_size": 4}  # train_batch_size = micro-batch x accumulation x devices
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        strategy=HPUDeepSpeedStrategy(config=config, parallel_devices=parallel_hpus),
        enable_progress_bar=False,
        fast_dev_run=8,
        plugins=[DeepSpeedPrecision(precision="bf16-mixed")],
        use_distributed_sampler=False,
        limit_train_batches=16,
        accumulate_grad_batches=2,
    )
    trainer.fit(model)
    engine = trainer.strategy.deepspeed_engine
    assert engine.gradient_accumulation_steps() == 2
    assert engine.train_micro_batch_size_per_gpu() == 2
    assert trainer.global_step == 4  # fast_dev_run=8 micro-batches, 2 per step
    (scheduler_config,) = trainer.lr_scheduler_configs
    assert type(scheduler_config.scheduler).__name__ == "WarmupDecayLR"
    assert scheduler_config.interval == "step"
    # linear warm-up from 0.02 to 0.05 over 4 steps: iteration 0 at the first step, 3 at the fourth
    assert engine.optimizer.param_groups[0]["lr"] == pytest.approx(0.02 + 0.03 * 3 / 4)
    assert model.activation_dtypes == {torch.bfloat16}


def test_module_optimizer_wins_over_config_optimizer():
    config = {
        "optimizer": {"type": "Adam", "params": {"lr": 0.5}},
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
    }
    trainer = _trainer(HPUDeepSpeedStrategy(config=config))
    trainer.fit(SampleModel())
    inner = trainer.strategy.deepspeed_engine.optimizer.optimizer
    assert isinstance(inner, torch.optim.SGD)
    assert "optimizer" not in trainer.strategy.config


@pytest.mark.parametrize("config_optimizer", [True, False], ids=["config optimizer", "no config optimizer"])
def test_module_scheduler_wins_over_config_scheduler_and_is_logged(config_optimizer, caplog):
    """Upstream's on CUDA without a config optimizer (DeepSpeed builds its config's scheduler only when given none)."""
    config = {
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.5}},
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
    }
    if config_optimizer:
        config["optimizer"] = {"type": "Adam", "params": {"lr": 0.5}}
    trainer = _trainer(HPUDeepSpeedStrategy(config=config))
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        trainer.fit(SampleModel())
    (scheduler_config,) = trainer.lr_scheduler_configs
    assert isinstance(scheduler_config.scheduler, torch.optim.lr_scheduler.StepLR)
    assert trainer.strategy.deepspeed_engine.lr_scheduler is None  # Lightning steps it, not DeepSpeed
    messages = [record.getMessage() for record in caplog.records]
    assert any("both define a learning-rate scheduler: the LightningModule's is used" in m for m in messages)
    assert any("both define an optimizer" in m for m in messages) == config_optimizer


@pytest.mark.parametrize(
    ("precision", "dtype"), [("32-true", torch.float32), ("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16)]
)
def test_precision_flag(precision, dtype):
    model = SampleModel()
    trainer = _trainer("hpu_deepspeed", precision=precision, max_steps=2)
    trainer.fit(model)
    assert isinstance(trainer.precision_plugin, HPUDeepSpeedPrecisionPlugin)
    assert model.activation_dtypes == {dtype}


@pytest.mark.parametrize(
    ("name", "stage", "offload"),
    [
        ("hpu_deepspeed", 2, False),
        ("hpu_deepspeed_stage_1", 1, False),
        ("hpu_deepspeed_stage_2", 2, False),
        ("hpu_deepspeed_stage_2_offload", 2, True),
        ("hpu_deepspeed_stage_3", 3, False),
        ("hpu_deepspeed_stage_3_offload", 3, True),
        # a script moved from CUDA keeps upstream's names
        ("deepspeed", 2, False),
        ("deepspeed_stage_1", 1, False),
        ("deepspeed_stage_2_offload", 2, True),
        ("deepspeed_stage_3", 3, False),
    ],
)
@pytest.mark.parametrize("accelerator", ["hpu", "auto"])
def test_strategy_names(name, stage, offload, accelerator):
    trainer = _trainer(name, accelerator=accelerator)
    assert type(trainer.strategy) is HPUDeepSpeedStrategy
    zero = trainer.strategy.config["zero_optimization"]
    assert zero["stage"] == stage
    assert ("offload_optimizer" in zero) == offload


def test_config_file_and_environment_variable(tmp_path, monkeypatch):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}, "zero_allow_untested_optimizer": True}))
    assert HPUDeepSpeedStrategy(config=str(path)).config["zero_optimization"]["stage"] == 3
    monkeypatch.setenv("PL_DEEPSPEED_CONFIG_PATH", str(path))
    trainer = _trainer("hpu_deepspeed", max_steps=1)
    trainer.fit(SampleModel())
    assert _zero_optimizer(trainer) == "DeepSpeedZeroOptimizer_Stage3"


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: _trainer("hpu_deepspeed_stage_3_offload_nvme"), MisconfigurationException, "NVMe"),
        (lambda: _trainer("deepspeed_stage_3_offload_nvme"), MisconfigurationException, "Offload to host memory"),
        (
            lambda: HPUDeepSpeedStrategy(
                config={"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}
            ),
            MisconfigurationException,
            '"offload_param": {"device": "nvme"}',
        ),
        (
            lambda: HPUDeepSpeedStrategy(stage=3, offload_optimizer=True, offload_optimizer_device="nvme"),
            MisconfigurationException,
            "offload_optimizer_device='nvme'",
        ),
        (lambda: HPUDeepSpeedStrategy(config="/no/such/ds_config.json"), MisconfigurationException, "does not exist"),
        (
            lambda: _trainer(HPUDeepSpeedStrategy(), accelerator="cpu"),
            MisconfigurationException,
            "runs on HPUs but `accelerator='cpu'`",
        ),
        (
            lambda: _trainer("hpu_deepspeed", plugins=[pl.plugins.HPUPrecisionPlugin("bf16-mixed")]),
            MisconfigurationException,
            "HPUDeepSpeedPrecisionPlugin",
        ),
        (lambda: _trainer("hpu_deepspeed", precision="64-true"), ValueError, "not supported on HPU"),
    ],
)
def test_bad_inputs_fail_early(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_two_optimizers_are_refused():
    class TwoOptimizers(SampleModel):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False  # otherwise Lightning refuses two optimizers before DeepSpeed

        def configure_optimizers(self):
            return torch.optim.SGD(self.l1.parameters(), lr=0.1), torch.optim.SGD(self.l2.parameters(), lr=0.1)

    with pytest.raises(MisconfigurationException, match="DeepSpeed currently only supports single optimizer"):
        _trainer("hpu_deepspeed").fit(TwoOptimizers())


@pytest.mark.parametrize("autoload", ["1", "0"])
def test_deepspeed_imported_first_still_uses_the_hpu(tmp_path, autoload):
    """DeepSpeed detects its accelerator when imported, by importing ``habana_frameworks.torch.hpu``. The Gaudi
    software is installed before any import, so DeepSpeed finds the HPU whether or not it was loaded on
    ``import torch`` (PyTorch's device-backend autoload, off with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "first.py"
    script.write_text(
        "import deepspeed\n"
        "from deepspeed.accelerator import get_accelerator\n"
        "assert get_accelerator().device_name() == 'hpu', get_accelerator().device_name()\n"
        "import torch\n"
        "import pytorch_lightning as pl\n"
        "from lightning.pytorch.demos.boring_classes import BoringModel\n"
        "trainer = pl.Trainer(accelerator='hpu', devices=1, strategy='hpu_deepspeed', max_steps=1, logger=False,\n"
        "                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)\n"
        "trainer.fit(BoringModel())\n"
        "assert get_accelerator().device_name() == 'hpu'\n"
        "assert trainer.strategy.deepspeed_engine.device.type == 'hpu'\n"
        "print('ok')\n"
    )
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": autoload}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict:
    """``ddp_run.py``'s model trained on one HPU without DeepSpeed on whole global batches, by number of epochs."""
    outs = {epochs: tmp_path_factory.mktemp(f"single{epochs}") for epochs in (1, 2)}
    wait(*(run_ddp(out, "--devices", "1", "--max-epochs", str(epochs)) for epochs, out in outs.items()))
    return {epochs: rank_results(out)[0] for epochs, out in outs.items()}


# stage 3 shards what stage 2 does and more; stage 2 (33 s) is a stress run, to keep the suite under its time
@pytest.mark.heavy
@pytest.mark.parametrize("stage", [pytest.param(2, marks=pytest.mark.stress), 3])
def test_two_processes_match_one_and_resume_from_zero_checkpoint(tmp_path, references, stage):
    """Each rank trains on its own rows; ZeRO all-reduces (stage 2) or partitions and gathers (stage 3) so that both
    ranks end where one process on the whole batches does. The ZeRO checkpoint resumes model, optimizer (momentum),
    scheduler and epoch on 2 processes, and Lightning's converter turns it into one fp32 state dict."""
    from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

    strategy, checkpoint = f"hpu_deepspeed_stage_{stage}", tmp_path / "zero.ckpt"
    first, resumed = tmp_path / "first", tmp_path / "resumed"
    first.mkdir(), resumed.mkdir()
    wait(run_ddp(first, "--devices", "2", "--strategy", strategy, "--checkpoint", str(checkpoint)))
    ranks = rank_results(first)
    assert [(r["world_size"], r["zero_stage"]) for r in ranks] == [(2, stage)] * 2
    assert_same_parameters(ranks[0]["state"], ranks[1]["state"])
    # float32 sums of the same gradients in another order: equal to rounding
    assert_same_parameters(ranks[0]["state"], references[1]["state"], tolerance=1e-6)

    assert checkpoint.is_dir()  # a ZeRO checkpoint: each rank's shard of the model and optimizer states
    converted = convert_zero_checkpoint_to_fp32_state_dict(checkpoint, tmp_path / "full.pt")
    assert converted["epoch"] == 1 and converted["global_step"] == 4  # saved after the first epoch ended
    assert_same_parameters(converted["state_dict"], ranks[0]["state"])

    wait(run_ddp(resumed, "--devices", "2", "--strategy", strategy, "--max-epochs", "2", "--resume", str(checkpoint)))
    for rank in rank_results(resumed):
        assert rank["global_step"] == references[2]["global_step"] == 8
        assert rank["lr"] == pytest.approx(references[2]["lr"])
        assert_same_parameters(rank["state"], references[2]["state"], tolerance=1e-6)


@VARIANT  # of the two-process run above, which resumes too
def test_one_process_resumes_from_zero_checkpoint(tmp_path, references):
    checkpoint, first, resumed = tmp_path / "zero.ckpt", tmp_path / "first", tmp_path / "resumed"
    first.mkdir(), resumed.mkdir()
    wait(run_ddp(first, "--strategy", "hpu_deepspeed_stage_3", "--checkpoint", str(checkpoint)))
    wait(run_ddp(resumed, "--strategy", "hpu_deepspeed_stage_3", "--max-epochs", "2", "--resume", str(checkpoint)))
    (rank,) = rank_results(resumed)
    assert rank["global_step"] == 8
    assert rank["lr"] == pytest.approx(references[2]["lr"])
    assert_same_parameters(rank["state"], references[2]["state"], tolerance=1e-6)


def test_load_full_weights_from_a_single_file_checkpoint(tmp_path):
    """A checkpoint of one file (here from one HPU without DeepSpeed) loads into a ZeRO-3 model, partitioned."""
    import deepspeed

    trained = SampleModel()
    trainer = _trainer("hpu_single", max_steps=3)
    trainer.fit(trained)
    trainer.save_checkpoint(tmp_path / "full.ckpt")
    expected = {name: tensor.detach().cpu() for name, tensor in trained.state_dict().items()}

    model = SampleModel()
    assert not torch.equal(model.l1.weight, expected["l1.weight"])
    trainer = _trainer(HPUDeepSpeedStrategy(stage=3, load_full_weights=True))
    trainer.test(model, ckpt_path=tmp_path / "full.ckpt")
    assert trainer.callback_metrics["test_acc"] > 0.5
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        loaded = {name: tensor.detach().cpu().clone() for name, tensor in model.state_dict().items()}
    assert_same_parameters(loaded, expected)


@pytest.mark.parametrize(("stage", "form"), [(2, "convert_modules"), (3, "constructor")])
@pytest.mark.usefixtures("amx_host")
def test_fp8_training(stage, form):
    """The reference page's note: fp8 under DeepSpeed as with HPUPrecisionPlugin, with HPUDeepSpeedPrecisionPlugin;
    lightning-habana's ``convert_modules`` before ``fit``, or the constructor, which replaces the layers at set-up."""
    from habana_frameworks.torch.hpex.experimental.transformer_engine import Linear, recipe

    model = SampleModel()
    if form == "convert_modules":
        plugin = HPUDeepSpeedPrecisionPlugin(precision="fp8")
        hybrid = recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID)
        plugin.convert_modules(model, replace_layers=True, recipe=hybrid)
        assert isinstance(model.l1, Linear) and isinstance(model.l2, Linear)
    else:
        plugin = HPUDeepSpeedPrecisionPlugin(precision="fp8", recipe={"fp8_format": "HYBRID"}, replace_layers=True)
        assert type(model.l1) is torch.nn.Linear
    trainer = _trainer(HPUDeepSpeedStrategy(stage=stage), plugins=[plugin])
    trainer.fit(model)
    assert isinstance(model.l1, Linear) and isinstance(model.l2, Linear)
    assert plugin.recipe.fp8_format == recipe.Format.HYBRID
    assert trainer.precision_plugin is plugin and trainer.strategy.config["bf16"]["enabled"]
    assert trainer.strategy.deepspeed_engine.zero_optimization_stage() == stage
    # the engine holds the model in bf16; the Transformer Engine layers scaled and computed in fp8 every step
    assert model.activation_dtypes == {torch.bfloat16}
    assert model.l1.fp8_state.state_dict()["steps"] == trainer.global_step - 1
    trainer.test(model)
    assert trainer.callback_metrics["test_acc"] > 0.5


def test_fp8_precision_flag_under_deepspeed():
    trainer = _trainer("hpu_deepspeed", precision="fp8", max_steps=1)
    assert isinstance(trainer.precision_plugin, HPUDeepSpeedPrecisionPlugin)
    assert trainer.precision_plugin.precision == "fp8"


INFERENCE_SCRIPT = """
import json, os, sys
import torch
import pytorch_lightning as pl
from pytorch_lightning.strategies import HPUDeepSpeedStrategy


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.block = Block()

    def forward(self, x):
        return self.block(x)

    def predict_step(self, batch, batch_idx):
        return self(batch)

    def predict_dataloader(self):
        return torch.utils.data.DataLoader(torch.arange(8.0).view(2, 4), batch_size=2)


model = Model()
expected = model(torch.arange(8.0).view(2, 4)).tolist()
inference = {"tensor_parallel": {"tp_size": 2}, "dtype": torch.float, "replace_with_kernel_inject": False}
# the layer whose partial outputs the ranks sum (l2 splits its input features across them), named as DeepSpeed names
# the children of a policy's class: with a leading dot
inference["injection_policy"] = {Block: (".l2",)}
if sys.argv[1] == "config":
    policy = inference.pop("injection_policy")
    strategy = HPUDeepSpeedStrategy(config=inference, injection_policy=policy)
else:
    strategy = HPUDeepSpeedStrategy(**inference)
trainer = pl.Trainer(accelerator="hpu", devices=2, strategy=strategy, logger=False, use_distributed_sampler=False)
predictions = trainer.predict(model)
engine = trainer.strategy.model
layer = engine.module.block.l2
line = json.dumps({"rank": trainer.global_rank, "predictions": predictions[0].tolist(), "expected": expected,
                   "engine": type(engine).__name__, "l2": [type(layer).__name__, list(layer.weight.shape)]})
os.write(sys.stdout.fileno(), f"RESULT {line}\\n".encode())
"""


@pytest.mark.parametrize("form", variants(["arguments", "config"], kept=["arguments"]))
def test_inference_arguments_of_lightning_habana_run_deepspeed_inference(tmp_path, form):
    """``dtype``, ``tensor_parallel``, ``replace_with_kernel_inject``, ``injection_policy`` (arguments, or keys of the
    config) put the model in DeepSpeed's inference engine, split across 2 HPUs, predicting what the model does."""
    import json
    import os
    import subprocess
    import sys

    from tests_pytorch.helpers.processes import free_port

    script = tmp_path / "inference.py"
    script.write_text(INFERENCE_SCRIPT)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(script), form], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [json.loads(report) for report in marked(result.stdout, "RESULT ")]
    assert sorted(rank["rank"] for rank in ranks) == [0, 1]
    for rank in ranks:
        assert rank["engine"] == "InferenceEngine"
        # each rank holds half of l2's input features, and the ranks sum their partial outputs
        assert rank["l2"] == ["LinearAllreduce", [2, 4]]
        torch.testing.assert_close(torch.tensor(rank["predictions"]), torch.tensor(rank["expected"]))


def test_unknown_arguments_name_both_lists():
    with pytest.raises(TypeError, match=r"unexpected arguments \['tensor_paralel'\].*init_inference.*tensor_parallel"):
        HPUDeepSpeedStrategy(tensor_paralel={"tp_size": 2})


def test_no_optimizer_names_configure_optimizers():
    class NoOptimizer(BoringModel):
        def configure_optimizers(self):
            return None

    with pytest.raises(MisconfigurationException, match=r"`LightningModule.configure_optimizers`.*returned None"):
        _trainer("hpu_deepspeed").fit(NoOptimizer())


def test_test_validate_predict_do_not_set_up_the_training_data():
    """A data module that builds its training split in ``setup("fit")``: evaluation never asks for it."""

    class FitOnlyTrainData(pl.LightningDataModule):
        def setup(self, stage):
            if stage == "fit":
                self.train_split = TensorDataset(torch.randn(8, 32))
            self.eval_split = TensorDataset(torch.randn(8, 32))

        def train_dataloader(self):
            return DataLoader(self.train_split, batch_size=4)

        def _eval(self):
            return DataLoader(self.eval_split, batch_size=4)

        val_dataloader = test_dataloader = predict_dataloader = _eval

    class Model(BoringModel):
        def _step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        validation_step = test_step = predict_step = _step

        def training_step(self, batch, batch_idx):
            return super().training_step(batch[0], batch_idx)

    trainer = _trainer("hpu_deepspeed")
    assert len(trainer.test(Model(), FitOnlyTrainData())) == 1
    assert len(trainer.validate(Model(), FitOnlyTrainData())) == 1
    assert len(trainer.predict(Model(), FitOnlyTrainData())) == 2
    # with training, the batch size of the training data labels DeepSpeed's throughput logs, as upstream
    fitted = _trainer("hpu_deepspeed")
    fitted.fit(Model(), FitOnlyTrainData())
    assert fitted.strategy.config["train_micro_batch_size_per_gpu"] == 4


ENGINE_DTYPE_SCRIPT = """
import json, os, sys
import torch
import pytorch_lightning as pl
from pytorch_lightning.strategies import HPUDeepSpeedStrategy


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))

    def forward(self, x):
        return self.net(x)

    def test_step(self, batch, batch_idx):
        self.log("out", self(batch).float().sum())

    def predict_step(self, batch, batch_idx):
        return self(batch)

    def test_dataloader(self):
        return torch.utils.data.DataLoader(torch.linspace(-1, 1, 16).view(4, 4), batch_size=2)

    predict_dataloader = test_dataloader


devices = int(sys.argv[1])
for precision in sys.argv[2:]:
    model = Model()
    expected = model(torch.linspace(-1, 1, 16).view(4, 4)[:2]).tolist()
    strategy = HPUDeepSpeedStrategy(dtype=torch.float, replace_with_kernel_inject=False)
    trainer = pl.Trainer(accelerator="hpu", devices=devices, strategy=strategy, precision=precision, logger=False,
                         use_distributed_sampler=False, enable_progress_bar=False, enable_model_summary=False)
    tested = trainer.test(model, verbose=False)[0]["out"]
    predictions = trainer.predict(model)
    line = json.dumps({"rank": trainer.global_rank, "precision": precision, "tested": tested,
                       "dtype": str(predictions[0].dtype), "predictions": predictions[0].float().tolist(),
                       "expected": expected, "weights": str(next(trainer.strategy.model.parameters()).dtype)})
    os.write(sys.stdout.fileno(), f"RESULT {line}\\n".encode())
"""

# what the engine's outputs are in: the mixed precisions autocast the engine's fp32 weights, the true ones follow it
_ENGINE_OUTPUT = {
    "32-true": "torch.float32",
    "bf16-mixed": "torch.bfloat16",
    "bf16-true": "torch.float32",
    "16-mixed": "torch.float16",
}


@pytest.mark.parametrize("devices", variants([1, 2], kept=[1]))
def test_the_inference_engines_dtype_wins_in_every_precision(tmp_path, devices):
    """``HPUDeepSpeedStrategy(dtype=torch.float)`` keeps the engine's weights in fp32 under every precision: inputs are
    cast to it (bf16 inputs met fp32 weights before: "mat1 and mat2 must have the same dtype"), the mixed precisions
    autocast as lightning-habana did; ``test`` and ``predict`` match the model on the CPU."""
    import json
    import os
    import subprocess
    import sys

    from tests_pytorch.helpers.processes import free_port

    script = tmp_path / "engine_dtype.py"
    script.write_text(ENGINE_DTYPE_SCRIPT)
    runs = []
    # one process per precision on 2 HPUs (each launches its second rank), all of them in one on 1 HPU
    for precisions in [list(_ENGINE_OUTPUT)] if devices == 1 else [[precision] for precision in _ENGINE_OUTPUT]:
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
        command = [sys.executable, str(script), str(devices), *precisions]
        runs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    found = []
    for run in runs:
        stdout, stderr = run.communicate(timeout=900)
        assert run.returncode == 0, stdout[-3000:] + stderr[-3000:]
        found += [json.loads(report) for report in marked(stdout, "RESULT ")]
    assert sorted((one["precision"], one["rank"]) for one in found) == sorted(
        (precision, rank) for precision in _ENGINE_OUTPUT for rank in range(devices)
    )
    for one in found:
        assert one["weights"] == "torch.float32" and one["dtype"] == _ENGINE_OUTPUT[one["precision"]], one
        # "bf16-true" rounds the weights to bf16 when it converts the model, before the engine takes them in fp32
        tolerance = {} if one["precision"] == "32-true" else {"atol": 3e-2, "rtol": 3e-2}
        torch.testing.assert_close(torch.tensor(one["predictions"]), torch.tensor(one["expected"]), **tolerance)
