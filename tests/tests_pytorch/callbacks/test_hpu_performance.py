"""``HPUPerformanceMonitor``: seeded hazards found with their line, count and fix, in lazy, eager and compiled runs,
with several processes, on a faked real Gaudi; the flag and the profiler summary."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import Logger

import pytorch_lightning as pl
from pytorch_lightning.accelerators import HPUAccelerator
from pytorch_lightning.callbacks import HPUPerformanceMonitor, hpu_performance
from tests_pytorch.helpers.runif import RunIf

SCRIPT = Path(__file__).parents[1] / "helpers" / "seeded_hazards.py"


def _line_of(name: str) -> int:
    lines = SCRIPT.read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if line.endswith(f"# hazard: {name}"))


def _run(tmp_path: Path, *hazards: str, compiled: bool = False, lazy: bool = False, devices: int = 1) -> dict:
    out = tmp_path / "reports.json"
    command = [sys.executable, str(SCRIPT), str(out), *hazards, "--devices", str(devices)]
    if compiled:
        command.append("--compile")
    env = {**os.environ, "VIRTUAL_HPU": "1", "PT_HPU_LAZY_MODE": "1" if lazy else "0"}
    if devices > 1:
        from tests_pytorch.helpers.processes import free_port

        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    reports = json.loads(out.read_text())
    reports["output"] = result.stdout + result.stderr
    return reports


def _only(report: dict, rank: int = 0) -> dict:
    (hazard,) = report["hazards"][str(rank)] if str(rank) in report["hazards"] else report["hazards"][rank]
    return hazard


@RunIf(virtual_hpu=True)  # host syncs and recompilations are recorded on the virtual Gaudi only
@pytest.mark.parametrize(
    ("mode", "compiled", "lazy"), [("eager", False, False), ("compile", True, False), ("lazy", False, True)]
)
def test_host_syncs_are_found_with_their_line(tmp_path, mode, compiled, lazy):
    reports = _run(tmp_path, "clean", "item", "print", "branch", "progress_bar", compiled=compiled, lazy=lazy)
    assert reports["clean"]["clean"], reports["clean"]["text"]
    assert reports["clean"]["text"].endswith(
        "clean, no host syncs, recompilations or CPU fallbacks in the training steps."
    )
    steps = reports["item"]["steps"]["0"]
    looked = steps - 2  # the first two steps are warm-up
    for name, fix in (("item", "keep the value a tensor"), ("print", "print outside"), ("branch", "torch.where")):
        found = reports[name]["hazards"]["0"]
        if compiled and name == "print":
            # printing breaks the compiled graph: the reads inside compiled parts of torch's formatting show at the
            # `def` line of the compiled function, the others at the print
            assert {hazard["kind"] for hazard in found} == {"host sync"}
            found = [hazard for hazard in found if hazard["code"].endswith("# hazard: print")]
        (hazard,) = found
        assert hazard["kind"] == "host sync"
        assert hazard["where"] == f"{SCRIPT}:{_line_of(name)} in training_step", hazard
        assert hazard["code"].endswith(f"# hazard: {name}")
        assert fix in hazard["fix"]
        # printing a tensor reads it several times (torch formats it from the device)
        assert hazard["count"] == looked if name != "print" else hazard["count"] >= looked
        assert hazard["steps"][:2] == [2, 3]
    bar = _only(reports["progress_bar"])
    assert bar["where"].startswith("Lightning, ") and "on_step=False" in bar["fix"]
    assert bar["count"] >= looked
    assert f"1.00 per step) at {SCRIPT}:{_line_of('item')}" in reports["item"]["text"]


@RunIf(virtual_hpu=True)  # host syncs and recompilations are recorded on the virtual Gaudi only
@pytest.mark.parametrize(("compiled", "lazy"), [(True, False), (False, True)], ids=["compile", "lazy"])
def test_recompilations_are_found_with_both_shapes(tmp_path, compiled, lazy):
    reports = _run(tmp_path, "clean", "ragged", "shapes", compiled=compiled, lazy=lazy)
    assert reports["clean"]["clean"], reports["clean"]["text"]

    ragged = reports["ragged"]
    (hazard,) = ragged["hazards"]["0"]
    last_step_of_first_epoch = ragged["training_batches"] - 1
    assert hazard["kind"] == "recompilation" and hazard["steps"][0] == last_step_of_first_epoch
    assert "drop_last=True" in hazard["fix"]
    assert "(16, 16) float32, (16,) int64 -> (5, 16) float32, (5,) int64" in hazard["details"][0]
    if compiled:
        assert "torch.compile: " in hazard["details"][0] and "expected 16, actual 5" in hazard["details"][0]
        # forward and backward compiled again, once: the smaller shape becomes dynamic
        assert hazard["count"] == 2
    else:
        # the bridge keeps the graph of the small batch: the next epoch's last step takes it from the cache
        assert hazard["count"] == 1
        assert hazard["where"].endswith("in Seeded.training_step")

    (hazard,) = reports["shapes"]["hazards"]["0"]
    assert hazard["kind"] == "recompilation" and "pad them to a few fixed sizes" in hazard["fix"]
    # lazy: each of the six batch sizes once, less the two seen in warm-up; compile: once, then a dynamic shape
    assert hazard["count"] == (2 if compiled else 4), hazard
    assert hazard["details"][0].startswith("batch shapes (")


@RunIf(virtual_hpu=True)  # host syncs and recompilations are recorded on the virtual Gaudi only
def test_two_processes_count_per_rank_in_one_report(tmp_path):
    reports = _run(tmp_path, "item", devices=2)
    item = reports["item"]
    assert set(item["steps"]) == {"0", "1"}
    assert item["hazards"]["0"] == []  # only the last rank reads its loss
    hazard = _only(item, rank=1)
    assert hazard["where"] == f"{SCRIPT}:{_line_of('item')} in training_step"
    assert hazard["count"] == item["steps"]["1"] - 2
    assert reports["output"].count("HPU performance report") == 1  # printed by rank 0 only
    assert "rank 1: host sync" in item["text"] and "rank 0: graph compilations" in item["text"]


class _Metric:
    """The bridge's metric at its documented shape: ``stats()`` gives ``[("TotalNumber", n), ...]``."""

    def __init__(self, counts: dict, name: str) -> None:
        self.counts, self.name = counts, name

    def stats(self) -> list:
        self.counts[self.name] += 3 if self.name == "graph_compilation" else 1
        return [("TotalNumber", self.counts[self.name]), ("TotalTime", 10), ("AvgTime", 1)]


class _Recorded(Logger):
    name, version = "recorded", 0
    metrics: list = []

    def log_metrics(self, metrics, step=None):
        self.metrics.append(metrics)

    def log_hyperparams(self, *args, **kwargs):
        pass


def test_on_a_real_gaudi_it_reads_the_bridge_metrics_at_epoch_ends(monkeypatch, capsys):
    from habana_frameworks.torch.hpu import metrics

    from virtual_hpu import events

    counts = {"graph_compilation": 0, "cpu_fallback": 0}
    monkeypatch.setattr(metrics, "metric_global", lambda name: _Metric(counts, name))
    monkeypatch.setattr(HPUAccelerator, "is_virtual", staticmethod(lambda: False))
    subscribed = []
    monkeypatch.setattr(events, "subscribe", lambda listener: subscribed.append(listener))
    logger, monitor = _Recorded(), HPUPerformanceMonitor()
    logger.metrics = []
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        max_epochs=2,
        limit_train_batches=4,
        limit_val_batches=0,
        callbacks=[monitor],
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(BoringModel())
    assert subscribed == []  # nothing recorded per step on real hardware
    epochs = [m for m in logger.metrics if "hpu/graph_compilations" in m]
    # two reads per epoch (start and end), each a step of the fake counters
    assert epochs == [{"hpu/graph_compilations": 3, "hpu/cpu_fallbacks": 1}] * 2
    report = monitor.report()
    assert report.compilations == {0: 6} and report.cpu_fallbacks == {0: 2} and not report.clean
    text = str(report)
    assert "CPU fallback: 2 ops ran on the CPU" in text and "VIRTUAL_HPU=1" in text
    assert "HPU performance report" in capsys.readouterr().out + text


def test_flag_adds_the_monitor_to_hpu_trainers(monkeypatch):
    monkeypatch.setenv(hpu_performance.ENVIRONMENT_FLAG, "1")
    hpu = pl.Trainer(accelerator="hpu", devices=1, logger=False)
    assert sum(isinstance(c, HPUPerformanceMonitor) for c in hpu.callbacks) == 1
    own = HPUPerformanceMonitor(warmup_steps=5)
    assert [
        c
        for c in pl.Trainer(accelerator="hpu", devices=1, callbacks=[own]).callbacks
        if isinstance(c, HPUPerformanceMonitor)
    ] == [own]
    assert not any(isinstance(c, HPUPerformanceMonitor) for c in pl.Trainer(accelerator="cpu", logger=False).callbacks)
    monkeypatch.setenv(hpu_performance.ENVIRONMENT_FLAG, "0")
    assert not any(isinstance(c, HPUPerformanceMonitor) for c in pl.Trainer(accelerator="hpu", devices=1).callbacks)


@RunIf(virtual_hpu=True)  # host syncs and recompilations are recorded on the virtual Gaudi only
def test_the_profiler_summary_includes_the_report(tmp_path):
    from pytorch_lightning.profilers import HPUProfiler

    class Syncing(BoringModel):
        def training_step(self, batch, batch_idx):
            output = super().training_step(batch, batch_idx)
            self.seen = output["loss"].item()
            return output

    profiler = HPUProfiler(dirpath=tmp_path, filename="profile")
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        max_steps=6,
        limit_val_batches=0,
        profiler=profiler,
        logger=False,
        callbacks=[HPUPerformanceMonitor(verbose=False)],
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    trainer.fit(Syncing())
    summary = profiler.summary()
    assert "HPU performance report" in summary and "host sync: 4 (1.00 per step)" in summary
    assert 'self.seen = output["loss"].item()' in summary


@RunIf(virtual_hpu=True)  # host syncs and recompilations are recorded on the virtual Gaudi only
def test_epoch_figures_are_logged_on_the_virtual_gaudi():
    class Reading(BoringModel):
        def training_step(self, batch, batch_idx):
            output = super().training_step(batch, batch_idx)
            self.seen = output["loss"].item()
            return output

    logger = _Recorded()
    logger.metrics = []
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        max_epochs=2,
        limit_train_batches=5,
        limit_val_batches=0,
        callbacks=[HPUPerformanceMonitor(verbose=False)],
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Reading())
    epochs = [m for m in logger.metrics if "hpu/host_syncs_per_step" in m]
    assert len(epochs) == 2
    # one read per step, every step counted (the report leaves the warm-up steps out, the figures do not)
    assert [m["hpu/host_syncs_per_step"] for m in epochs] == [1.0, 1.0]
    assert [m["hpu/recompilations"] for m in epochs] == [0, 0]
    assert [m["hpu/cpu_fallbacks"] for m in epochs] == [0, 0]
