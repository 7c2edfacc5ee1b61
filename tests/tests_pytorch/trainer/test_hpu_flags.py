"""How ``pytorch_lightning.Trainer`` turns HPU flags into an accelerator, a strategy and a precision plugin."""

import logging
import os
import subprocess
import sys

import pytest
import torch
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException

import pytorch_lightning as pl
from lightning_fabric.strategies.hpu_ddp_options import HCCL_DDP_OPTIONS
from pytorch_lightning.accelerators import HPUAccelerator
from pytorch_lightning.plugins import HPUCheckpointIO, HPUPrecisionPlugin
from pytorch_lightning.strategies import HPUParallelStrategy, SingleHPUStrategy
from tests_pytorch.helpers.runif import VARIANT, RunIf


def _trainer(**kwargs) -> pl.Trainer:
    return pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, **kwargs)


@pytest.mark.parametrize("accelerator", ["hpu", "HPU", "auto", HPUAccelerator()])
def test_single_device_selection(accelerator):
    trainer = _trainer(accelerator=accelerator, devices=1)
    assert isinstance(trainer.accelerator, HPUAccelerator)
    assert isinstance(trainer.strategy, SingleHPUStrategy)
    assert trainer.strategy.root_device == torch.device("hpu", 0)
    assert isinstance(trainer.precision_plugin, HPUPrecisionPlugin)
    assert trainer.precision_plugin.precision == "32-true"
    assert isinstance(trainer.strategy.checkpoint_io, HPUCheckpointIO)


def test_auto_is_every_device_in_parallel():
    trainer = _trainer(accelerator="auto")
    assert trainer.num_devices == HPUAccelerator.auto_device_count()
    assert isinstance(trainer.strategy, HPUParallelStrategy)
    assert trainer.strategy.parallel_devices == HPUAccelerator.get_parallel_devices(trainer.num_devices)
    assert trainer.strategy.process_group_backend == "hccl"


@pytest.mark.parametrize(
    ("strategy", "devices", "expected"),
    [
        ("auto", 1, SingleHPUStrategy),
        ("auto", 2, HPUParallelStrategy),
        ("hpu_single", 1, SingleHPUStrategy),
        ("hpu_parallel", 2, HPUParallelStrategy),
        ("hpu_parallel", 1, HPUParallelStrategy),
        ("hpu_parallel_spawn", 2, HPUParallelStrategy),
        ("hpu_ddp", 2, HPUParallelStrategy),
    ],
)
def test_strategy_choice(strategy, devices, expected):
    trainer = _trainer(accelerator="hpu", strategy=strategy, devices=devices)
    assert type(trainer.strategy) is expected
    assert trainer.num_devices == devices


def test_strategy_names_choose_launcher():
    assert _trainer(accelerator="hpu", strategy="hpu_parallel", devices=2).strategy._start_method == "popen"
    assert _trainer(accelerator="hpu", strategy="hpu_parallel_spawn", devices=2).strategy._start_method == "spawn"
    assert _trainer(accelerator="hpu", strategy="hpu_ddp", devices=2).strategy._start_method == "popen"


def test_lightning_habana_ddp_names():
    from pytorch_lightning.strategies import HPUDDPStrategy

    trainer = _trainer(accelerator="hpu", strategy=HPUDDPStrategy(), devices=2)
    assert type(trainer.strategy) is HPUParallelStrategy
    assert trainer.strategy.process_group_backend == "hccl"
    assert "hpu_ddp" in pl.strategies.StrategyRegistry.available_strategies()


def test_strategy_instances_and_hpu_strategy_implies_hpu():
    trainer = _trainer(strategy=HPUParallelStrategy(static_graph=True), devices=2)
    assert isinstance(trainer.accelerator, HPUAccelerator)
    assert trainer.strategy._ddp_kwargs == {**HCCL_DDP_OPTIONS, "static_graph": True}
    trainer = _trainer(strategy="hpu_single")
    assert isinstance(trainer.accelerator, HPUAccelerator) and isinstance(trainer.strategy, SingleHPUStrategy)


def test_num_nodes_goes_parallel(monkeypatch):
    for variable, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "NODE_RANK": "0"}.items():
        monkeypatch.setenv(variable, value)
    trainer = _trainer(accelerator="hpu", devices=1, num_nodes=2)
    assert isinstance(trainer.strategy, HPUParallelStrategy)
    assert trainer.num_nodes == 2 and trainer.world_size == 2


def test_cpu_stays_cpu():
    trainer = _trainer(accelerator="cpu", devices=1)
    assert isinstance(trainer.accelerator, CPUAccelerator)
    assert type(trainer.strategy) is SingleDeviceStrategy
    trainer = _trainer(accelerator="cpu", strategy="ddp", devices=2)
    assert type(trainer.strategy) is DDPStrategy


@pytest.mark.parametrize(
    ("precision", "expected"),
    [
        (32, "32-true"),
        ("32", "32-true"),
        ("32-true", "32-true"),
        (16, "bf16-mixed"),
        ("16", "bf16-mixed"),
        ("16-mixed", "16-mixed"),
        ("bf16", "bf16-mixed"),
        ("bf16-mixed", "bf16-mixed"),
        ("bf16-true", "bf16-true"),
        ("16-true", "16-true"),
    ],
)
def test_precision_flags(precision, expected):
    trainer = _trainer(accelerator="hpu", devices=1, precision=precision)
    assert isinstance(trainer.precision_plugin, HPUPrecisionPlugin)
    assert trainer.precision_plugin.precision == expected


def test_precision_plugin_instance_is_kept():
    plugin = HPUPrecisionPlugin("bf16-mixed")
    assert _trainer(accelerator="hpu", devices=1, plugins=[plugin]).precision_plugin is plugin


def test_user_checkpoint_io_is_respected():
    io = TorchCheckpointIO()
    assert _trainer(accelerator="hpu", devices=1, plugins=io).strategy.checkpoint_io is io


class _OwnDDPStrategy(DDPStrategy):
    """A user's subclass of an upstream strategy: its HPU counterpart would lose what it overrides."""


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        ({"accelerator": "hpu", "strategy": "ddp_notebook", "devices": 2}, "starts its processes by forking"),
        ({"accelerator": "hpu", "strategy": _OwnDDPStrategy()}, "HPUs run with an HPU strategy"),
        ({"accelerator": "hpu", "strategy": "hpu_nonexistent"}, "Choose one of .*hpu_parallel"),
        ({"accelerator": "cpu", "strategy": "hpu_parallel"}, "runs on HPUs but `accelerator='cpu'`"),
        ({"accelerator": "hpu", "strategy": "hpu_single", "devices": 2}, "runs on one HPU"),
        ({"accelerator": "hpu", "precision": "64-true"}, "not supported on HPU"),
        ({"accelerator": "hpu", "precision": "transformer-engine"}, "not supported on HPU"),
        ({"accelerator": "hpu", "precision": "fp8-magic"}, "not supported on HPU"),
        ({"accelerator": "hpu", "devices": 99}, "only 8 are available"),
        ({"accelerator": "hpu", "devices": [1, 3]}, "only the first n HPUs can be chosen"),
    ],
)
def test_misconfigurations_fail_early(flags, match):
    with pytest.raises((MisconfigurationException, ValueError), match=match):
        _trainer(**flags)


def test_precision_flag_and_plugin_conflict():
    with pytest.raises(ValueError, match="Choose one"):
        _trainer(accelerator="hpu", devices=1, precision="bf16-mixed", plugins=[HPUPrecisionPlugin("bf16-mixed")])


def test_env_defaults_select_hpu(monkeypatch):
    monkeypatch.setenv("PL_TRAINER_ACCELERATOR", "hpu")
    monkeypatch.setenv("PL_TRAINER_DEVICES", "2")
    monkeypatch.setenv("PL_TRAINER_PRECISION", "bf16-mixed")
    trainer = _trainer()
    assert isinstance(trainer.strategy, HPUParallelStrategy) and trainer.num_devices == 2
    assert trainer.precision_plugin.precision == "bf16-mixed"


def test_logs_hpu_usage(caplog):
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        _trainer(accelerator="hpu", devices=2)
    assert any(
        record.getMessage().startswith("HPU available: True (") and record.getMessage().endswith("using: 2 HPUs")
        for record in caplog.records
    )


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )


def test_hpu_without_any_gaudi_fails_clearly():
    result = _run("import pytorch_lightning as pl; pl.Trainer(accelerator='hpu')", VIRTUAL_HPU="0")
    assert result.returncode != 0
    assert "no Intel Gaudi is available" in result.stderr and "VIRTUAL_HPU=1" in result.stderr
    # and "auto" quietly falls back to the CPU
    result = _run(
        "import pytorch_lightning as pl; print(type(pl.Trainer(accelerator='auto').accelerator).__name__)",
        VIRTUAL_HPU="0",
    )
    assert result.stdout.strip().endswith("CPUAccelerator"), result.stderr


@RunIf(virtual_hpu=True)  # simulates first-generation Gaudi
@pytest.mark.parametrize(
    ("precision", "instead"), [("16-mixed", "bf16-mixed"), pytest.param("16-true", "bf16-true", marks=VARIANT)]
)
def test_fp16_refused_on_first_generation_gaudi(precision, instead):
    code = f"import pytorch_lightning as pl; pl.Trainer(accelerator='hpu', devices=1, precision={precision!r})"
    result = _run(code, VIRTUAL_HPU="1", VIRTUAL_HPU_GENERATION="GAUDI")
    assert result.returncode != 0 and "needs Gaudi2 or newer" in result.stderr
    assert f"Use `precision={instead!r}`" in result.stderr
    assert _run(code, VIRTUAL_HPU="1", VIRTUAL_HPU_GENERATION="GAUDI2").returncode == 0


@pytest.mark.parametrize(("name", "start_method"), [("ddp", "popen"), ("ddp_spawn", "spawn")])
def test_cuda_data_parallel_names_mean_hpu_parallel(name, start_method):
    from pytorch_lightning.strategies import HPUParallelStrategy

    trainer = _trainer(accelerator="hpu", strategy=name, devices=2)
    assert type(trainer.strategy) is HPUParallelStrategy
    assert trainer.strategy._start_method == start_method


def test_a_trainer_of_another_size_than_the_process_group_is_refused():
    """A process that already holds a 1-process group (a notebook, a test run) and asks for 2 devices would train
    alone while the rank it launched waits forever: refused before anything is launched."""
    import torch.distributed as dist
    from lightning.pytorch.demos.boring_classes import BoringModel

    from tests_pytorch.helpers.processes import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        trainer = pl.Trainer(accelerator="hpu", devices=2, max_steps=1, logger=False, enable_checkpointing=False)
        for stage in (trainer.fit, trainer.validate, trainer.test, trainer.predict):
            with pytest.raises(MisconfigurationException, match=r"already belongs to a process group of 1 .* runs 2"):
                stage(BoringModel())
        assert "LOCAL_RANK" not in os.environ  # nothing was launched
        # the group's own size is fine
        trainer = pl.Trainer(accelerator="hpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False)
        trainer.fit(BoringModel())
        assert trainer.global_step == 1
    finally:
        dist.destroy_process_group()
