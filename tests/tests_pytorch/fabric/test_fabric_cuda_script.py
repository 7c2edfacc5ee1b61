"""Fabric configured as CUDA scripts configure it, with HPUs: ``fabric run`` and its ``LT_*`` variables, upstream
strategy instances, ``devices`` lists, a precision plugin given to the strategy."""

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.fabric.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, SingleDeviceStrategy

from lightning_fabric.accelerators import HPUAccelerator
from lightning_fabric.plugins.precision import HPUFSDPPrecision, HPUPrecision
from lightning_fabric.strategies import HPUDeepSpeedStrategy, HPUFSDPStrategy, HPUParallelStrategy, SingleHPUStrategy
from lightning_fabric.strategies.hpu_ddp_options import HCCL_DDP_OPTIONS
from tests_pytorch.helpers.processes import free_port

FABRIC = Path(sys.executable).with_name("fabric")

# a Fabric script that imports only lightning and reports, per rank, what its flags resolved to after a step
_SCRIPT = """
import json, sys
import lightning as L
import torch

fabric = L.Fabric()
model = torch.nn.Linear(4, 2)
model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
loss = model(torch.ones(3, 4, device=fabric.device)).sum()
fabric.backward(loss)
optimizer.step()
world = fabric.all_gather(torch.tensor([fabric.global_rank], device=fabric.device))
report = {
    "accelerator": type(fabric.accelerator).__name__,
    "strategy": type(fabric.strategy).__name__,
    "precision": type(fabric._precision).__name__,
    "precision_flag": fabric._precision.precision,
    "device": str(fabric.device),
    "world": world.flatten().tolist(),
}
with open(f"{sys.argv[1]}/rank{fabric.global_rank}.json", "w") as file:
    json.dump(report, file)
"""


def _env(**extra: str) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("LT_", "LOCAL_RANK", "RANK"))}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def _fabric_run(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    command = [str(FABRIC), "run", *flags, f"--main-port={free_port()}", str(script), str(tmp_path)]
    return subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=600)


def _reports(tmp_path: Path) -> list:
    return [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank*.json"))]


def test_fabric_run_on_two_hpus_resolves_as_fabric_does(tmp_path):
    """``fabric run`` passes its flags as ``LT_*`` variables, which upstream's connector reads after ours resolved."""
    result = _fabric_run(tmp_path, "--accelerator=auto", "--devices=2", "--strategy=ddp", "--precision=bf16-mixed")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    reports = _reports(tmp_path)
    expected = L.Fabric(accelerator="hpu", devices=2, strategy="ddp", precision="bf16-mixed")
    assert [report["device"] for report in reports] == ["hpu:0", "hpu:1"]
    for report in reports:
        assert report["accelerator"] == type(expected.accelerator).__name__ == "HPUAccelerator"
        assert report["strategy"] == type(expected.strategy).__name__ == "HPUParallelStrategy"
        assert report["precision"] == type(expected._precision).__name__
        assert report["precision_flag"] == "bf16-mixed" and report["world"] == [0, 1]


def test_fabric_run_refuses_the_hpu_name():
    """Upstream's CLI accepts a fixed list of accelerator names without "hpu"; "auto" (or no --accelerator) is the way
    on a Gaudi, as the docs say."""
    result = subprocess.run(
        [str(FABRIC), "run", "--accelerator=hpu", __file__], env=_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode != 0 and "'hpu' is not one of" in result.stderr


def test_lt_variables_are_applied_before_resolving(monkeypatch):
    """What ``fabric run --accelerator=... --devices=2 --strategy=ddp`` sets, read by a Fabric built in the script."""
    for name, value in {"ACCELERATOR": "hpu", "STRATEGY": "ddp", "DEVICES": "2", "PRECISION": "bf16-mixed"}.items():
        monkeypatch.setenv(f"LT_{name}", value)
    monkeypatch.setenv("LT_NUM_NODES", "1")
    fabric = L.Fabric()
    assert isinstance(fabric.accelerator, HPUAccelerator) and isinstance(fabric.strategy, HPUParallelStrategy)
    assert fabric.strategy.num_processes == 2 and fabric._precision.precision == "bf16-mixed"
    # under the CLI a differing flag in the script is refused, as upstream refuses it
    monkeypatch.setenv("LT_CLI_USED", "1")
    with pytest.raises(ValueError, match="conflicts with the value `--devices=2` set through the CLI"):
        L.Fabric(devices=4)


@pytest.mark.parametrize(
    ("upstream", "hpu_class", "devices"),
    [
        (SingleDeviceStrategy(device="cuda:0"), SingleHPUStrategy, 1),
        (DDPStrategy(find_unused_parameters=True, start_method="spawn"), HPUParallelStrategy, 2),
        (DeepSpeedStrategy(stage=3, offload_optimizer=True), HPUDeepSpeedStrategy, 2),
        (FSDPStrategy(sharding_strategy="SHARD_GRAD_OP"), HPUFSDPStrategy, 2),
    ],
    ids=["single", "ddp", "deepspeed", "fsdp"],
)
def test_upstream_strategy_instances_become_their_hpu_counterparts(upstream, hpu_class, devices):
    fabric = L.Fabric(accelerator="hpu", devices=devices, strategy=upstream)
    strategy = fabric.strategy
    assert type(strategy) is hpu_class and strategy is not upstream
    if isinstance(upstream, SingleDeviceStrategy):
        assert strategy.root_device == torch.device("hpu", 0)
    if type(upstream) is DDPStrategy:
        assert strategy._ddp_kwargs == {**HCCL_DDP_OPTIONS, "find_unused_parameters": True}
        assert strategy._start_method == "spawn"
    if isinstance(upstream, DeepSpeedStrategy):
        assert strategy.config["zero_optimization"]["stage"] == 3
        assert strategy.config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    if isinstance(upstream, FSDPStrategy):
        assert strategy.sharding_strategy.name == "SHARD_GRAD_OP"


def test_upstream_ddp_names_with_options_become_the_hpu_strategy():
    strategy = L.Fabric(accelerator="hpu", devices=2, strategy="ddp_find_unused_parameters_true").strategy
    assert type(strategy) is HPUParallelStrategy
    assert strategy._ddp_kwargs == {**HCCL_DDP_OPTIONS, "find_unused_parameters": True}
    assert strategy._start_method == "popen"
    with pytest.raises(ValueError, match="forking"):
        L.Fabric(accelerator="hpu", devices=2, strategy="ddp_fork")


def test_devices_lists():
    assert L.Fabric(accelerator="hpu", devices=[0, 1]).strategy.num_processes == 2
    with pytest.raises(ValueError, match="only the first n HPUs can be chosen"):
        L.Fabric(accelerator="hpu", devices=[1, 3])


class _RecordsDtype(torch.nn.Linear):
    def __init__(self) -> None:
        super().__init__(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = super().forward(x)
        # Fabric returns outputs in the default dtype
        self.seen_dtype = output.dtype
        return output


def test_precision_plugin_given_to_the_strategy():
    plugin = HPUPrecision("bf16-mixed")
    fabric = L.Fabric(accelerator="hpu", strategy=SingleHPUStrategy(precision=plugin))
    assert fabric._precision is plugin
    model = fabric.setup(_RecordsDtype())
    model(torch.ones(1, 4, device=fabric.device))
    assert model.seen_dtype == torch.bfloat16
    fsdp = HPUFSDPPrecision("bf16-mixed")
    assert L.Fabric(accelerator="hpu", devices=2, strategy=HPUFSDPStrategy(precision=fsdp))._precision is fsdp
    with pytest.raises(ValueError, match=r"conflicts with the strategy's `HPU\w*Precision`"):
        L.Fabric(accelerator="hpu", strategy=SingleHPUStrategy(precision=HPUPrecision("bf16-mixed")), precision="32")
