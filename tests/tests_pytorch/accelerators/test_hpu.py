"""The HPU accelerator on the (virtual) Gaudi: availability, device parsing and memory statistics."""

import os
import subprocess
import sys

import pytest
import torch
from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from pytorch_lightning import Trainer
from pytorch_lightning.accelerators import HPUAccelerator
from tests_pytorch.helpers.gaudi import GAUDI_MEMORY_KEYS
from tests_pytorch.helpers.runif import RunIf


def test_registered_and_available():
    assert AcceleratorRegistry.get("hpu").__class__ is HPUAccelerator
    assert HPUAccelerator.name() == "hpu"
    assert HPUAccelerator.is_available()
    import habana_frameworks.torch.hpu as hthpu

    assert HPUAccelerator.auto_device_count() == hthpu.device_count() >= 2
    assert HPUAccelerator.get_device_name() in ("GAUDI", "GAUDI2", "GAUDI3")


@pytest.mark.parametrize(("devices", "expected"), [(1, 1), (2, 2), ("3", 3), (" 2 ", 2)])
def test_parse_devices_counts(devices, expected):
    assert HPUAccelerator.parse_devices(devices) == expected


@pytest.mark.parametrize("devices", ["auto", -1, "-1"])
def test_parse_devices_all(devices):
    assert HPUAccelerator.parse_devices(devices) == HPUAccelerator.auto_device_count()


@pytest.mark.parametrize("devices", [0, "0", -2, [0, 1], "0,1", "hpu", 1.5, True, None])
def test_parse_devices_rejects_what_gaudi_cannot_honour(devices):
    with pytest.raises(MisconfigurationException, match="HPU devices are selected by count"):
        HPUAccelerator.parse_devices(devices)


def test_parse_devices_more_than_available():
    available = HPUAccelerator.auto_device_count()
    with pytest.raises(MisconfigurationException, match=f"only {available} are available"):
        HPUAccelerator.parse_devices(available + 1)


def test_is_lazy_follows_the_execution_mode():
    import habana_frameworks.torch.core as htcore

    assert HPUAccelerator.is_lazy() is htcore.is_lazy()
    # and in a process started in the other mode
    other = not htcore.is_lazy()
    code = "from pytorch_lightning.accelerators import HPUAccelerator; print(HPUAccelerator.is_lazy())"
    environment = {**os.environ, "PT_HPU_LAZY_MODE": str(int(other))}
    result = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True)
    assert result.stdout.split()[-1:] == [str(other)], result.stderr


@RunIf(virtual_hpu=True)  # sets the virtual node's size
def test_visible_modules_limit_the_devices():
    # two jobs sharing an 8-card node, as on Gaudi
    code = (
        "from pytorch_lightning.accelerators import HPUAccelerator\n"
        "print(HPUAccelerator.auto_device_count())\n"
        "HPUAccelerator.parse_devices(3)"
    )
    environment = {**os.environ, "VIRTUAL_HPU_DEVICES": "8", "HABANA_VISIBLE_MODULES": "4,5"}
    result = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True)
    assert result.stdout.split()[-1:] == ["2"], result.stderr
    assert "requested 3 HPUs but only 2 are available" in result.stderr


def test_parallel_devices_carry_indices():
    assert HPUAccelerator.get_parallel_devices(3) == [torch.device("hpu", i) for i in range(3)]


def test_device_stats_are_gaudi_memory_stats():
    accelerator = HPUAccelerator()
    before = accelerator.get_device_stats(torch.device("hpu", 0))
    assert set(before) == set(GAUDI_MEMORY_KEYS)
    block = torch.empty(1 << 20, device="hpu:0")  # 4 MiB
    during = accelerator.get_device_stats(torch.device("hpu", 0))
    assert during["InUse"] >= before["InUse"] + block.numel() * block.element_size()
    assert during["NumAllocs"] > before["NumAllocs"]
    assert during["Limit"] > 0


class _Float64Model(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.double())


def test_float64_model_trains_with_float32_precision():
    """A float64 model trains on HPU as on the real bridge: float64 tensors, float32 arithmetic."""
    torch.manual_seed(0)
    model = _Float64Model()
    reference = _Float64Model()
    reference.load_state_dict(model.state_dict())
    flags = {"max_steps": 3, "logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
    for accelerator, trained in (("hpu", model), ("cpu", reference)):
        torch.manual_seed(1)  # the same random data
        Trainer(accelerator=accelerator, devices=1, **flags).fit(trained)
    assert model.layer.weight.dtype == torch.float64
    difference = (model.layer.weight.detach().cpu() - reference.layer.weight.detach()).abs().max().item()
    # float32 rounding, not float64's, yet the same training
    assert 0 < difference < 1e-5


@pytest.mark.parametrize(
    ("device", "problem"),
    [("cpu", "its strategy put the model on `cpu`"), ("hpu:0", "its strategy is not one of them")],
)
def test_devices_are_set_up_only_for_an_hpu_strategy(device, problem):
    """Reached only past the connectors, which choose HPU strategies for ``lightning.Trainer`` too."""
    with pytest.raises(MisconfigurationException, match="trains only under an HPU strategy") as refusal:
        HPUAccelerator().setup_device(torch.device(device))
    assert problem in str(refusal.value)
    assert "`lightning`'s and `pytorch_lightning`'s alike) choose one for `accelerator='hpu'`" in str(refusal.value)
    assert "`lightning_fabric.strategies` to Fabric or of `pytorch_lightning.strategies` to the Trainer" in str(
        refusal.value
    )


@pytest.mark.parametrize(("strategy", "expected"), [({}, "SingleHPUStrategy")], ids=["auto"])
def test_upstream_trainer_given_the_hpu_accelerator_picks_an_hpu_strategy(strategy, expected, tmp_path):
    # upstream's Trainer builds the HPU connector (src/_lightning_hpu), which resolves the strategy as ours does
    import lightning.pytorch as upstream

    trainer = upstream.Trainer(
        accelerator=HPUAccelerator(), devices=1, max_steps=1, default_root_dir=tmp_path, logger=False, **strategy
    )
    assert type(trainer.strategy).__name__ == expected
    trainer.fit(BoringModel())
    assert trainer.global_step == 1


def test_upstream_trainer_with_an_explicit_hpu_strategy_trains(tmp_path):
    import lightning.pytorch as upstream

    from pytorch_lightning.strategies import SingleHPUStrategy

    trainer = upstream.Trainer(
        accelerator=HPUAccelerator(), strategy=SingleHPUStrategy(), max_steps=2, default_root_dir=tmp_path, logger=False
    )
    trainer.fit(BoringModel())
    assert trainer.global_step == 2


def test_upstream_trainer_on_two_devices_trains_on_both(tmp_path):
    script = tmp_path / "upstream.py"
    script.write_text(
        "import os\n"
        "import lightning.pytorch as upstream\n"
        "from lightning.pytorch.demos.boring_classes import BoringModel\n"
        "from pytorch_lightning.accelerators import HPUAccelerator\n"
        "trainer = upstream.Trainer(accelerator=HPUAccelerator(), devices=2, max_steps=1, logger=False)\n"
        "trainer.fit(BoringModel())\n"
        "result = f'RESULT {trainer.global_rank} {type(trainer.strategy).__name__} {trainer.global_step}\\n'\n"
        "os.write(1, result.encode())  # one write: both ranks print into the same pipe\n"
    )
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1"}
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RESULT 0 HPUParallelStrategy 1" in result.stdout, result.stdout[-3000:]


@RunIf(virtual_hpu=True)  # poses as an image with stock PyTorch
def test_lazy_mode_on_an_image_with_stock_pytorch_is_refused_early_with_the_fix():
    """Gaudi 1.24's images with stock PyTorch: the bridge refuses to load in lazy mode; Trainer and Fabric say so when
    they are built, with what to do, whether HPUs were asked for or found by ``"auto"``."""
    code = (
        "import lightning as L\n"
        "from lightning.fabric.utilities.exceptions import MisconfigurationException\n"
        "for build in (lambda: L.Trainer(accelerator='hpu', devices=1), lambda: L.Fabric(accelerator='auto')):\n"
        "    try:\n"
        "        build()\n"
        "    except MisconfigurationException as error:\n"
        "        print('refused:', error)\n"
    )
    environment = {**os.environ, "PT_HPU_LAZY_MODE": "1", "VIRTUAL_HPU_STOCK_PYTORCH": "1"}
    result = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    refusals = [line for line in result.stdout.splitlines() if line.startswith("refused:")]
    assert len(refusals) == 2, result.stdout + result.stderr
    for refusal in refusals:
        assert f"Upstream PyTorch version {torch.__version__} is not supported in Lazy mode." in refusal
        assert "needs Intel's own PyTorch build" in refusal and "unset `PT_HPU_LAZY_MODE`" in refusal
        assert "backend='hpu_backend'" in refusal
