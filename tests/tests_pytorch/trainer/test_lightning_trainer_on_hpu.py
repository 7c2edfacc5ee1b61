"""``lightning.Trainer`` resolves HPU flags as ``pytorch_lightning.Trainer`` does: one connector, whichever package the
script imports, whatever the order of its imports and however its processes are started."""

import os
import re
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE
from lightning.pytorch.demos.boring_classes import BoringModel

import pytorch_lightning as pl
from _lightning_hpu.accelerator_connector import HPUAcceleratorConnector
from pytorch_lightning.accelerators import HPUAccelerator
from pytorch_lightning.strategies import HPUDeepSpeedStrategy, HPUFSDPStrategy, HPUParallelStrategy, SingleHPUStrategy
from tests_pytorch.helpers import cuda_script_run
from tests_pytorch.helpers.processes import free_port, rank_results
from tests_pytorch.helpers.runif import variants

SCRIPT = Path(cuda_script_run.__file__)


def _classes(trainer) -> tuple:
    return (
        type(trainer.accelerator),
        type(trainer.strategy),
        type(trainer.precision_plugin),
        trainer.precision_plugin.precision,
        trainer.num_devices,
        trainer.strategy._start_method if hasattr(trainer.strategy, "_start_method") else None,
    )


@pytest.mark.parametrize(
    "flags",
    [
        {"accelerator": "hpu"},
        {"accelerator": "auto"},
        {},
        {"accelerator": "hpu", "devices": 1, "precision": "bf16-mixed"},
        {"accelerator": "hpu", "devices": 2, "precision": "16-mixed"},
        {"accelerator": "auto", "devices": 2, "strategy": "ddp"},
        {"accelerator": "hpu", "devices": 2, "strategy": "ddp_spawn"},
        {"accelerator": "hpu", "devices": 2, "strategy": "deepspeed_stage_2", "precision": "bf16-mixed"},
        {"accelerator": "hpu", "devices": 2, "strategy": "fsdp", "precision": "bf16-true"},
        {"accelerator": "hpu", "devices": 2, "strategy": "hpu_parallel"},
        {"accelerator": "hpu", "devices": [0, 1]},
        {"accelerator": "hpu", "precision": "fp8"},
    ],
)
def test_both_packages_resolve_the_same_flags_the_same_way(flags):
    ours, upstream = pl.Trainer(logger=False, **flags), L.Trainer(logger=False, **flags)
    assert type(upstream._accelerator_connector) is HPUAcceleratorConnector
    assert type(ours._accelerator_connector) is HPUAcceleratorConnector
    assert _classes(ours) == _classes(upstream)
    assert isinstance(upstream.accelerator, HPUAccelerator)


def test_expected_hpu_objects_through_lightning():
    trainer = L.Trainer(accelerator="hpu", devices=2, strategy="deepspeed_stage_3", precision="bf16-mixed")
    assert isinstance(trainer.strategy, HPUDeepSpeedStrategy) and trainer.strategy.zero_stage_3
    assert isinstance(L.Trainer(accelerator="hpu", devices=2, strategy="fsdp").strategy, HPUFSDPStrategy)
    assert isinstance(L.Trainer(accelerator="auto").strategy, HPUParallelStrategy)
    assert isinstance(L.Trainer(accelerator="hpu", devices=1).strategy, SingleHPUStrategy)


class _RecordsAutocast(BoringModel):
    def training_step(self, batch, batch_idx):
        output = self.layer(batch)
        self.autocast = (
            torch.is_autocast_enabled("hpu"),
            torch.get_autocast_dtype("hpu"),
            output.dtype,
            output.device.type,
        )
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_autocasts_on_the_hpu_through_lightning(precision):
    """Upstream's connector alone picks CUDA's autocast for these flags, warns that CUDA is absent and trains in
    fp32."""
    model = _RecordsAutocast()
    trainer = L.Trainer(accelerator="hpu", devices=1, precision=precision, max_steps=2, logger=False)
    trainer.fit(model)
    dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float16
    assert model.autocast == (True, dtype, dtype, "hpu")


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    return subprocess.run(
        [sys.executable, "-c", code], env={**environment, **env}, capture_output=True, text=True, timeout=300
    )


_RESOLVED = (
    "t = L.Trainer(accelerator={accelerator!r}, precision='bf16-mixed', logger=False);"
    "print(type(t.accelerator).__name__, type(t.strategy).__name__, type(t.precision_plugin).__name__)"
)


@pytest.mark.parametrize("accelerator", ["hpu", "auto"])
@pytest.mark.parametrize(
    "imports",
    # torch first is the order in which torch's autoload, not Lightning's import, activates the device
    variants(
        ["import lightning as L", "import lightning as L; import torch", "import torch; import lightning as L"],
        kept=["import torch; import lightning as L"],
    ),
)
def test_lightning_alone_in_any_import_order(imports, accelerator):
    result = _run(f"{imports}; {_RESOLVED.format(accelerator=accelerator)}", VIRTUAL_HPU="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-3:] == ["HPUAccelerator", "HPUParallelStrategy", "HPUMixedPrecision"]


@pytest.mark.heavy
def test_autoload_turned_off():
    """``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns off every device backend's autoload, ours with it: importing
    ``pytorch_lightning`` (before or after ``lightning``) then has the Trainer resolve HPU flags."""
    env = {"VIRTUAL_HPU": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    for imports in (
        "import pytorch_lightning; import lightning as L",
        "import lightning as L; import pytorch_lightning",
    ):
        result = _run(f"{imports}; {_RESOLVED.format(accelerator='hpu')}", **env)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split()[-3:] == ["HPUAccelerator", "HPUParallelStrategy", "HPUMixedPrecision"]
    result = _run(f"import lightning as L; {_RESOLVED.format(accelerator='hpu')}", **env)
    assert result.returncode != 0 and "hpu" in result.stderr


_LOOKS = """
import warnings
warnings.simplefilter("always")
from {package} import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
trainer = Trainer(
    accelerator={accelerator!r}, devices=1, max_steps=2, limit_val_batches=1, logger=False, enable_checkpointing=False
)
print("progress bar:", type(trainer.progress_bar_callback).__name__)
trainer.fit(BoringModel())
"""


def _what_it_shows(output: str) -> list[str]:
    """The device lines, the warnings (with the lines they point at) and the progress bar's class of a run; temporary
    folders by kind, not name: torch 2.6 warns at exit of the one that ``torch.distributed.nn.jit`` makes."""
    lines = re.sub(r"TemporaryDirectory '[^']*'", "TemporaryDirectory '...'", output).splitlines()
    shown = []
    for number, line in enumerate(lines):
        if " available: " in line or line.startswith("progress bar:"):
            shown.append(line)
        elif "Warning: " in line:
            shown += lines[number : number + 2]
    return shown


@pytest.mark.parametrize("accelerator", variants(["hpu", "cpu"], kept=["hpu"]))
def test_both_trainers_look_the_same_on_a_gaudi(accelerator):
    """``lightning.Trainer`` and ``pytorch_lightning.Trainer``, each in a fresh process with only its package imported,
    log the same device lines (the HPU line among them), warn the same and show the same progress bar."""
    runs = {}
    for package in ("pytorch_lightning", "lightning.pytorch"):
        result = _run(_LOOKS.format(package=package, accelerator=accelerator), VIRTUAL_HPU="1")
        assert result.returncode == 0, result.stderr
        runs[package] = _what_it_shows(result.stdout + result.stderr)
    used = 1 if accelerator == "hpu" else 0
    # "(virtual GAUDI2)" on the virtual Gaudi, the device's name on a Gaudi (and in the rehearsal)
    assert any(
        re.fullmatch(rf"HPU available: True \((virtual )?GAUDI\d?\), using: {used} HPUs", line)
        for line in runs["lightning.pytorch"]
    ), runs["lightning.pytorch"]
    assert "GPU available: False, used: False" in runs["lightning.pytorch"]
    bar = ("HPU" if accelerator == "hpu" else "") + ("Rich" if _RICH_AVAILABLE else "TQDM") + "ProgressBar"
    assert f"progress bar: {bar}" in runs["lightning.pytorch"]
    assert runs["lightning.pytorch"] == runs["pytorch_lightning"]


def test_without_a_gaudi_lightning_is_upstream():
    code = "import lightning as L; t = L.Trainer(logger=False); print(type(t._accelerator_connector).__name__)"
    result = _run(code, VIRTUAL_HPU="0")
    assert result.returncode == 0 and result.stdout.split()[-1] == "_AcceleratorConnector", result.stderr


def _script(tmp_path: Path, case: str, package: str = "lightning") -> list:
    return _scripts(tmp_path, [case], package)[case]


def _scripts(tmp_path: Path, cases: list, package: str = "lightning") -> dict:
    """Run the CUDA-style script's ``cases`` one after another in one launch of 2 ranks; each case's results by rank."""
    env = {
        **{key: value for key, value in os.environ.items() if not key.startswith(("LOCAL_RANK", "RANK", "WORLD"))},
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }
    out = tmp_path / package
    out.mkdir()
    command = [sys.executable, str(SCRIPT), "--out", str(out), "--case", ",".join(cases), "--package", package]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    results = {case: rank_results(out / case) for case in cases}
    for case, ranks in results.items():
        assert len(ranks) == 2 and [rank["global_step"] for rank in ranks] == [2, 2], case
    return results


@pytest.mark.heavy  # 30 s: room under make test's 20 minutes on torch 2.11 (CI's); make test-heavy runs it in CI
def test_lightning_script_trains_ddp_in_bf16_on_two_hpus(tmp_path):
    """Lightning's launcher re-runs the script for rank 1, which imports only ``lightning`` too."""
    ranks = _script(tmp_path, "ddp")
    assert [rank["seen"]["device"] for rank in ranks] == ["hpu:0", "hpu:1"]
    for rank in ranks:
        assert rank["classes"]["connector"] == "HPUAcceleratorConnector"
        assert rank["classes"]["strategy"] == "HPUParallelStrategy" and rank["world_size"] == 2
        assert rank["seen"]["autocast"] and rank["seen"]["output_dtype"] == torch.bfloat16
    ours = _script(tmp_path, "ddp", package="pytorch_lightning")
    assert [rank["classes"]["strategy"] for rank in ours] == [rank["classes"]["strategy"] for rank in ranks]
    assert [rank["seen"] for rank in ours] == [rank["seen"] for rank in ranks]


def test_lightning_cli_resolves_hpu_flags(tmp_path):
    from lightning.pytorch.cli import LightningCLI

    args = ["--trainer.accelerator=hpu", "--trainer.devices=1", "--trainer.precision=bf16-mixed"]
    cli = LightningCLI(BoringModel, args=[*args, "--trainer.logger=false"], run=False, save_config_callback=None)
    assert type(cli.trainer).__module__ == "lightning.pytorch.trainer.trainer"
    assert isinstance(cli.trainer.strategy, SingleHPUStrategy)
    assert cli.trainer.precision_plugin.precision == "bf16-mixed"
