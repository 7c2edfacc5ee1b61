"""MFU on HPUs: upstream's ``ThroughputMonitor`` (the Trainer's) and Fabric's throughput utilities divide the FLOPs a
run does by the peak of the Gaudi generation present, from Intel's published figures, as they do on CUDA."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from lightning.fabric.utilities import throughput as fabric_throughput
from lightning.pytorch.callbacks import throughput_monitor
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers.logger import Logger

import lightning_fabric as lf
import pytorch_lightning as pl
from lightning_fabric.accelerators.hpu_flops import GAUDI_PEAK_FLOPS, peak_flops
from pytorch_lightning.callbacks import ThroughputMonitor


class _Recorded(Logger):
    """Keeps what the Trainer logs."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[dict] = []

    name, version = "recorded", 0

    def log_metrics(self, metrics, step=None):
        self.metrics.append(dict(metrics))

    def log_hyperparams(self, *args, **kwargs):
        pass


class _Counted(BoringModel):
    flops_per_batch = 2 * 32 * 2 * 2  # forward and backward of the 32x2 layer, two rows a batch

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(16, 32), batch_size=2)


def _mfu_of_a_fit(precision: str) -> list:
    logger = _Recorded()
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        precision=precision,
        max_steps=4,
        limit_val_batches=0,
        logger=logger,
        log_every_n_steps=1,
        callbacks=[ThroughputMonitor(batch_size_fn=len, window_size=2)],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(_Counted())
    return [(m["train/device/mfu"], m["train/device/flops_per_sec"]) for m in logger.metrics if "train/device/mfu" in m]


def test_the_trainers_throughput_monitor_logs_mfu_against_the_generations_peak():
    generation = pl.accelerators.HPUAccelerator.get_device_name()
    found = _mfu_of_a_fit("bf16-mixed")
    assert found, "no train/device/mfu was logged"
    for mfu, flops_per_sec in found:
        assert mfu == pytest.approx(flops_per_sec / GAUDI_PEAK_FLOPS[generation]["bf16"])


def test_fp32_has_no_published_peak_and_so_no_mfu():
    assert _mfu_of_a_fit("32-true") == []


def test_fabrics_throughput_divides_by_the_same_peak():
    fabric = lf.Fabric(accelerator="hpu", devices=1, precision="bf16-mixed")
    monitor = fabric_throughput.ThroughputMonitor(fabric, window_size=2)
    generation = lf.accelerators.HPUAccelerator.get_device_name()
    assert monitor.available_flops == GAUDI_PEAK_FLOPS[generation]["bf16"]
    for step in range(3):
        monitor.update(time=1.0 + step, batches=step + 1, samples=2 * (step + 1), flops=1e12)
    metrics = monitor.compute()
    assert metrics["device/mfu"] == pytest.approx(
        metrics["device/flops_per_sec"] / GAUDI_PEAK_FLOPS[generation]["bf16"]
    )


def test_upstreams_answer_for_other_devices_and_the_names_both_tools_call():
    # both modules' names refer to the one that knows Gaudi, which asks upstream's for other devices
    assert throughput_monitor.get_available_flops is fabric_throughput.get_available_flops
    upstream = fabric_throughput.get_available_flops.__wrapped__
    assert fabric_throughput.get_available_flops(torch.device("cpu"), torch.bfloat16) == upstream(
        torch.device("cpu"), torch.bfloat16
    )


@pytest.mark.parametrize(
    ("dtype", "generation", "tflops"),
    [
        (torch.bfloat16, "GAUDI2", 432),
        (torch.float16, "GAUDI3", 1835),
        (torch.int8, "GAUDI2", 865),  # what upstream's tools pass for an fp8 plugin
        (torch.float32, "GAUDI3", None),
        (torch.int8, "GAUDI", None),
    ],
)
def test_peaks_by_generation_and_type(dtype, generation, tflops):
    assert peak_flops(dtype, generation) == (None if tflops is None else tflops * 10**12)


_GAUDI3_SCRIPT = """
import json, sys
import torch
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.demos.boring_classes import BoringModel
import lightning as L

class Counted(BoringModel):
    flops_per_batch = 10**9

monitor = ThroughputMonitor(batch_size_fn=len, window_size=2)
trainer = L.Trainer(accelerator="hpu", devices=1, precision="bf16-mixed", max_steps=4, limit_val_batches=0,
                    callbacks=[monitor], enable_checkpointing=False, enable_progress_bar=False, logger=False)
trainer.fit(Counted())
print("AVAILABLE", json.dumps(monitor.available_flops))
"""


def test_a_gaudi3_run_of_lightning_trainer_divides_by_gaudi3s_peak(tmp_path):
    """``lightning.Trainer`` and upstream's callback, as a script written for CUDA has them, on the third generation."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_GAUDI3_SCRIPT))
    result = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "VIRTUAL_HPU_GENERATION": "GAUDI3"},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert f"AVAILABLE {1835 * 10**12}" in result.stdout


class _TimedAt(ThroughputMonitor):
    """Notes when it reads the clock, in the order of ``events``."""

    def __init__(self, events: list) -> None:
        super().__init__(batch_size_fn=len, window_size=2)
        self.events = events

    def on_train_batch_end(self, *args, **kwargs) -> None:
        self.events.append("monitor")
        super().on_train_batch_end(*args, **kwargs)


def test_the_monitor_times_the_device_after_it_finished_each_batch(monkeypatch):
    """Gaudi runs a batch's work after the host queued it: the Trainer waits for the HPU right before each
    ``ThroughputMonitor`` reads its clock, as upstream waits for CUDA devices."""
    events = []
    synchronize = torch.hpu.synchronize
    monkeypatch.setattr(torch.hpu, "synchronize", lambda *args: (events.append("sync"), synchronize(*args))[1])
    monitor = _TimedAt(events)
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        max_steps=3,
        limit_val_batches=0,
        callbacks=[monitor],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    assert type(trainer.callbacks[trainer.callbacks.index(monitor) - 1]).__name__ == "HPUThroughputSync"
    trainer.fit(_Counted())
    timed = [index for index, event in enumerate(events) if event == "monitor"]
    assert len(timed) == 3
    assert all(events[index - 1] == "sync" for index in timed)
    # on the CPU nothing is added
    cpu = pl.Trainer(accelerator="cpu", callbacks=[ThroughputMonitor(batch_size_fn=len)], logger=False)
    assert not any(type(callback).__name__ == "HPUThroughputSync" for callback in cpu.callbacks)
