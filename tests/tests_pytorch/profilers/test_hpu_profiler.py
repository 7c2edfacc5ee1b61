"""HPUProfiler on the (virtual) Gaudi: traces per stage and rank, HPU activity, custom actions, summary and the CLI."""

import gc
import json
import os
import pickle
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.profilers import SimpleProfiler
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.autograd import DeviceType
from torch.autograd.profiler_util import EventList, FunctionEvent
from torch.profiler import ProfilerActivity

import pytorch_lightning as pl
from pytorch_lightning.cli import LightningCLI
from pytorch_lightning.profilers import HPUProfiler
from tests_pytorch.helpers.processes import free_port
from tests_pytorch.helpers.runif import RunIf
from virtual_hpu import torch_support

# c10's device type of hpu tensors, as the trace's memory events name it: HPU, or PrivateUse1 where hpu is torch's
# PrivateUse1 backend (the virtual Gaudi on PyPI's builds from torch 2.9)
_HPU_IS_PRIVATEUSE1 = torch._C._get_privateuse1_backend_name() == "hpu"
HPU_DEVICE_TYPE = (DeviceType.PrivateUse1 if _HPU_IS_PRIVATEUSE1 else DeviceType.HPU).value
# torch.profiler has HPU activity from torch 2.7; before, HPUProfiler records the CPU only, and warns
_HPU_ACTIVITY = torch_support.installed() >= torch_support.PROFILER_HAS_HPU_ACTIVITY
needs_hpu_activity = pytest.mark.skipif(not _HPU_ACTIVITY, reason="torch.profiler has HPU activity from torch 2.7")
CPU_AND_HPU = {ProfilerActivity.CPU, ProfilerActivity.HPU} if _HPU_ACTIVITY else {ProfilerActivity.CPU}
TRACE_SUFFIX = r"\.\d+\.pt\.trace\.json"


def _trainer(root: Path, profiler, **kwargs) -> pl.Trainer:
    defaults = {
        "accelerator": "hpu",
        "devices": 1,
        "default_root_dir": root,
        "max_epochs": 1,
        "limit_train_batches": 4,
        "limit_val_batches": 2,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    return pl.Trainer(profiler=profiler, **{**defaults, **kwargs})


def _traces(directory: Path) -> dict:
    """File name -> parsed JSON of every trace in ``directory``."""
    return {path.name: json.loads(path.read_text()) for path in directory.glob("*.pt.trace.json")}


def _only_trace(directory: Path, pattern: str) -> list:
    traces = _traces(directory)
    assert len(traces) == 1, list(traces)
    ((name, trace),) = traces.items()
    assert re.fullmatch(pattern + TRACE_SUFFIX, name), name
    return trace["traceEvents"]


def _hpu_memory(events: list) -> list:
    memory = [event for event in events if event.get("name") == "[memory]"]
    return [event for event in memory if event["args"]["Device Type"] == HPU_DEVICE_TYPE]


def _ranges(events: list, name: str) -> list:
    return [event for event in events if event.get("ph") == "X" and event["name"] == name]


def _within(event: dict, ranges: list) -> bool:
    return any(span["ts"] <= event["ts"] <= span["ts"] + span["dur"] for span in ranges)


@pytest.fixture
def recorded_activities(monkeypatch) -> list:
    """The activities of every torch profiler session that starts recording."""
    seen = []
    prepare_trace = torch.profiler.profile.prepare_trace

    def spy(self):
        seen.append(set(self.activities))
        prepare_trace(self)

    monkeypatch.setattr(torch.profiler.profile, "prepare_trace", spy)
    return seen


@needs_hpu_activity
def test_fit_writes_a_trace_with_hpu_activity(tmp_path, recorded_activities):
    _trainer(tmp_path, HPUProfiler()).fit(BoringModel())

    # no dirpath: the Trainer's log_dir; one process: no rank in the name
    events = _only_trace(tmp_path, r"fit-\[Strategy\]SingleHPUStrategy\.(training|validation)_step")
    assert recorded_activities == [CPU_AND_HPU]
    names = {event.get("name") for event in events}
    assert {"aten::addmm", "[pl][profile][Strategy]SingleHPUStrategy.training_step"} <= names
    assert "[pl][module]torch.nn.modules.linear.Linear: layer" in names
    # HPU tensors allocated and freed, the layer's outputs among them
    hpu_memory = _hpu_memory(events)
    assert any(event["args"]["Bytes"] > 0 for event in hpu_memory)
    assert any(event["args"]["Bytes"] < 0 for event in hpu_memory)
    assert any(_within(event, _ranges(events, "aten::addmm")) for event in hpu_memory if event["args"]["Bytes"] > 0)
    # what chrome://tracing needs: a phase on every event, a start and a duration on complete events
    assert all("ph" in event for event in events)
    assert all(isinstance(event["ts"], (int, float)) and event["dur"] >= 0 for event in events if event["ph"] == "X")


@needs_hpu_activity
def test_a_trace_and_a_report_per_stage(tmp_path):
    dirpath = tmp_path / "profiles"
    profiler = HPUProfiler(dirpath=dirpath, filename="perf-logs")
    trainer = _trainer(tmp_path, profiler, limit_test_batches=2, limit_predict_batches=2)
    model = BoringModel()
    trainer.fit(model)
    trainer.validate(model)
    trainer.test(model)
    trainer.predict(model)

    traces = sorted(_traces(dirpath))
    assert len(traces) == 4
    step = {"fit": "(training|validation)", "validate": "validation", "test": "test", "predict": "predict"}
    for stage, name in zip(("fit", "predict", "test", "validate"), traces):
        action = rf"\[Strategy\]SingleHPUStrategy\.{step[stage]}_step"
        assert re.fullmatch(rf"{stage}-perf-logs-{action}{TRACE_SUFFIX}", name)
        assert _hpu_memory(json.loads((dirpath / name).read_text())["traceEvents"])
        report = (dirpath / f"{stage}-perf-logs.txt").read_text()
        assert report.startswith(f"{stage.upper()} Profiler Report: HPUProfiler, HPU (")


@needs_hpu_activity
def test_reused_for_stages_that_run_no_step(tmp_path, monkeypatch):
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    dirpath = tmp_path / "profiles"
    profiler = HPUProfiler(dirpath=dirpath, filename="perf-logs")
    trainer = _trainer(tmp_path, profiler, max_epochs=None, max_steps=2, limit_val_batches=0)
    model = BoringModel()
    trainer.fit(model)
    report = (dirpath / "fit-perf-logs.txt").read_text()
    # the second fit starts where the first ended, at `max_steps`: it runs no step and records nothing
    trainer.fit(model)
    assert trainer.global_step == 2
    assert (dirpath / "fit-perf-logs.txt").read_text() == report
    # a new Trainer with the same profiler profiles again
    _trainer(tmp_path, profiler, max_epochs=None, max_steps=2, limit_val_batches=0).fit(BoringModel())
    assert (dirpath / "fit-perf-logs.txt").read_text().startswith("FIT Profiler Report: HPUProfiler, HPU (")
    del trainer, profiler
    gc.collect()
    assert not unraisable, [hook.exc_value for hook in unraisable]


class ProfiledModel(BoringModel):
    """The documentation's custom-profiling example: the model holds the profiler and marks its own actions."""

    def __init__(self, profiler=None):
        super().__init__()
        self.profiler = profiler

    def custom_processing_step_basic(self, data):
        with self.profiler.profile("my_custom_action"):
            data = data * 2
        return data

    def custom_processing_step_granular(self, data):
        self.profiler.start("my_custom_action")
        data = data / 2
        self.profiler.stop("my_custom_action")
        return data

    def training_step(self, batch, batch_idx):
        batch = self.custom_processing_step_granular(self.custom_processing_step_basic(batch))
        return super().training_step(batch, batch_idx)


@needs_hpu_activity
def test_custom_actions_are_ranges_in_the_trace(tmp_path):
    profiler = HPUProfiler()
    _trainer(tmp_path, profiler, limit_val_batches=0).fit(ProfiledModel(profiler))

    events = _only_trace(tmp_path, r"fit-\[Strategy\]SingleHPUStrategy\.training_step")
    actions = _ranges(events, "[pl][profile]my_custom_action")
    steps = _ranges(events, "[pl][profile][Strategy]SingleHPUStrategy.training_step")
    # the first step is not recorded (the profiler's warm-up); both forms in every recorded one
    assert len(steps) == 3 and len(actions) == 2 * 3
    assert all(_within(action, steps) for action in actions)
    # the work inside the action ran on the HPU
    assert any(_within(event, actions) for event in _hpu_memory(events) if event["args"]["Bytes"] > 0)


@needs_hpu_activity
def test_distributed_profiling_writes_a_trace_and_a_report_per_rank(tmp_path):
    script = tmp_path / "train.py"
    # upstream Lightning and torch first, our profiler module before the package: the import order must not matter
    script.write_text(
        textwrap.dedent(
            """
        import sys

        import lightning.pytorch
        import torch
        from lightning.pytorch.demos.boring_classes import BoringModel

        from pytorch_lightning.profilers.hpu import HPUProfiler
        import pytorch_lightning as pl

        if __name__ == "__main__":
            trainer = pl.Trainer(
                accelerator="hpu", devices=2, strategy="hpu_parallel", max_epochs=1, limit_train_batches=4,
                limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, profiler=HPUProfiler(dirpath=sys.argv[1], filename="perf-logs"),
            )
            trainer.fit(BoringModel())
        """
        )
    )
    out = tmp_path / "profiles"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    result = subprocess.run(
        [sys.executable, str(script), str(out)], env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr[-3000:]

    assert len(_traces(out)) == 2
    for rank in (0, 1):
        (name,) = [name for name in _traces(out) if name.startswith(f"fit-perf-logs-{rank}-")]
        action = r"\[Strategy\]HPUParallelStrategy\.training_step"
        assert re.fullmatch(rf"fit-perf-logs-{rank}-{action}{TRACE_SUFFIX}", name)
        hpu_memory = _hpu_memory(json.loads((out / name).read_text())["traceEvents"])
        # each process drives its own device
        assert hpu_memory and {event["args"]["Device Id"] for event in hpu_memory} == {rank}
        report = (out / f"fit-perf-logs-{rank}.txt").read_text()
        assert report.startswith(f"FIT Profiler Report: HPUProfiler, rank {rank}, HPU (")


@pytest.mark.parametrize("accelerator", ["hpu", "cpu"])
@pytest.mark.parametrize("name", ["hpu", "HPU"])
def test_profiler_name(name, accelerator):
    trainer = pl.Trainer(accelerator=accelerator, devices=1, profiler=name, logger=False)
    assert type(trainer.profiler) is HPUProfiler


def test_other_profiler_names_stay_upstream():
    assert type(pl.Trainer(accelerator="hpu", devices=1, profiler="simple", logger=False).profiler) is SimpleProfiler
    with pytest.raises(MisconfigurationException, match="it can only be one of"):
        pl.Trainer(accelerator="hpu", devices=1, profiler="hpuu", logger=False)


def test_cpu_accelerator_records_the_cpu_only(tmp_path, recorded_activities):
    class TouchesHPU(BoringModel):
        def training_step(self, batch, batch_idx):
            torch.ones(256, device="hpu").add_(1)
            return super().training_step(batch, batch_idx)

    profiler = HPUProfiler(filename="perf-logs")
    _trainer(tmp_path, profiler, accelerator="cpu", limit_val_batches=0).fit(TouchesHPU())

    assert recorded_activities == [{ProfilerActivity.CPU}]
    events = _only_trace(tmp_path, r"fit-perf-logs-\[Strategy\]SingleDeviceStrategy\.training_step")
    assert "aten::addmm" in {event.get("name") for event in events}
    assert not _hpu_memory(events)
    report = (tmp_path / "fit-perf-logs.txt").read_text()
    assert report.startswith("FIT Profiler Report: HPUProfiler, CPU only")
    assert "HPU time" not in report and "lazy mode" not in report


def _sections(summary: str) -> dict:
    """Heading -> body of the summary's parts."""
    sections, heading = {}, None
    for line in summary.splitlines():
        if line.startswith(("Top operators by", "Recorded ranges", "Note:")):
            heading = line.split(" by ")[-1] if line.startswith("Top") else line.split(" ")[0]
            sections[heading] = []
        elif heading is not None:
            sections[heading].append(line)
    return {heading: "\n".join(lines) for heading, lines in sections.items()}


@needs_hpu_activity
@pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])
def test_summary_on_hpu(tmp_path, hpu_mode):
    profiler = HPUProfiler(filename="perf-logs")
    _trainer(tmp_path, profiler, limit_val_batches=0).fit(ProfiledModel(profiler))
    summary = (tmp_path / "fit-perf-logs.txt").read_text()
    import habana_frameworks.torch.core as htcore

    import virtual_hpu

    device = rf"HPU \((virtual )?GAUDI\d?, {hpu_mode} mode\) and CPU"
    assert re.fullmatch(rf"FIT Profiler Report: HPUProfiler, {device}", summary.splitlines()[0])
    sections = _sections(summary)
    assert list(sections)[:3] == ["self HPU time", "self CPU time", "Recorded"]
    if virtual_hpu.is_active():
        assert sections["self HPU time"].startswith("(no HPU device time: the virtual Gaudi runs HPU operators on the")
    operators = sections["self CPU time"]
    assert "Self CPU" in operators and "aten::addmm" in operators and "[pl]" not in operators
    ranges = {line.split()[0]: line.split()[1] for line in sections["Recorded"].splitlines()[2:]}
    assert ranges["[pl][profile]my_custom_action"] == "6"
    assert ranges["[pl][profile][Strategy]SingleHPUStrategy.training_step"] == "3"
    assert ("Note:" in sections) == htcore.is_lazy() == (hpu_mode == "lazy")
    if hpu_mode == "lazy":
        assert "synchronously" in summary and "approximate" in summary


def _op(index: int, name: str, cpu_us: int, hpu_us: int) -> FunctionEvent:
    start = index * 1000
    event = FunctionEvent(
        id=index,
        name=name,
        thread=0,
        start_us=start,
        end_us=start + cpu_us,
        stack=[],
        use_device="hpu",
        device_type=DeviceType.CPU,
    )
    event.append_kernel(f"{name} on the TPC", 0, hpu_us)
    return event


@needs_hpu_activity
def test_summary_ranks_operators_by_hpu_time():
    # a real Gaudi reports device time per operator; the virtual one cannot, so feed the events of such a run
    profiler = HPUProfiler(activities=[ProfilerActivity.CPU, ProfilerActivity.HPU], row_limit=2)
    ops = [
        _op(1, "aten::mm", cpu_us=1, hpu_us=500),
        _op(2, "aten::add", cpu_us=30, hpu_us=50),
        _op(3, "aten::relu", cpu_us=10, hpu_us=5),
    ]
    profiler.function_events = EventList(ops, use_device="hpu")
    profiler.function_events._build_tree()  # as torch does when it collects events

    sections = _sections(profiler.summary())
    by_hpu = [line.split()[0] for line in sections["self HPU time"].splitlines() if line.lstrip().startswith("aten::")]
    by_cpu = [line.split()[0] for line in sections["self CPU time"].splitlines() if line.lstrip().startswith("aten::")]
    assert by_hpu == ["aten::mm", "aten::add"]
    assert by_cpu == ["aten::add", "aten::relu"]
    assert "Self HPU" in sections["self HPU time"] and "Self HPU" in sections["self CPU time"]
    assert "self HPU time total: 555.000us" in sections["self CPU time"]


@pytest.mark.parametrize(
    "profiler_args",
    [
        ["--trainer.profiler=hpu"],
        [
            "--trainer.profiler=pytorch_lightning.profilers.HPUProfiler",
            "--trainer.profiler.init_args.filename=perf-logs",
        ],
    ],
)
@needs_hpu_activity
def test_lightning_cli(tmp_path, profiler_args):
    cli = LightningCLI(
        BoringModel,
        args=[
            "fit",
            "--trainer.accelerator=hpu",
            "--trainer.devices=1",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=2",
            "--trainer.limit_val_batches=0",
            "--trainer.logger=false",
            "--trainer.enable_checkpointing=false",
            "--trainer.enable_progress_bar=false",
            *profiler_args,
        ],
    )
    assert type(cli.trainer.profiler) is HPUProfiler
    prefix = "fit-perf-logs-" if len(profiler_args) > 1 else "fit-"
    events = _only_trace(tmp_path, re.escape(prefix) + r"\[Strategy\]SingleHPUStrategy\.training_step")
    assert _hpu_memory(events)


def test_stays_out_of_saved_hyperparameters(tmp_path):
    class WithHyperparameters(ProfiledModel):
        def __init__(self, profiler=None, width: int = 32):
            super().__init__(profiler)
            self.save_hyperparameters()

    profiler = HPUProfiler()
    trainer = _trainer(tmp_path, profiler, limit_val_batches=0, enable_checkpointing=True)
    with pytest.warns(UserWarning, match="Attribute 'profiler' removed from hparams"):
        trainer.fit(WithHyperparameters(profiler))

    (checkpoint,) = (tmp_path / "checkpoints").glob("*.ckpt")
    assert torch.load(checkpoint, weights_only=False)["hyper_parameters"] == {"width": 32}
    restored = WithHyperparameters.load_from_checkpoint(checkpoint)
    assert restored.hparams["width"] == 32 and restored.profiler is None
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(profiler)


def test_flame_graph_stacks_without_chrome_trace(tmp_path):
    profiler = HPUProfiler(export_to_chrome=False, export_to_flame_graph=True)
    _trainer(tmp_path, profiler, limit_train_batches=1, limit_val_batches=0).fit(BoringModel())

    assert not _traces(tmp_path)
    (stacks,) = tmp_path.glob("*.stack")
    assert stacks.name == "fit-[Strategy]SingleHPUStrategy.training_step.stack"
    lines = stacks.read_text().splitlines()
    # "frame;frame;... <microseconds>", the input of flamegraph.pl
    assert lines and all(re.fullmatch(r".+ \d+", line) for line in lines)
    assert any("training_step" in line for line in lines)


@RunIf(tb_profiler=True)
def test_trace_opens_in_tensorboard(tmp_path):
    from torch_tb_profiler import consts
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    _trainer(tmp_path, HPUProfiler(), limit_val_batches=0).fit(BoringModel())
    (trace,) = tmp_path.glob("*.pt.trace.json")

    # what the plugin does for each file it finds in a run directory
    worker, span = consts.WORKER_PATTERN.match(trace.name).groups()
    data = RunProfileData.parse(worker, span[1:], str(trace), str(tmp_path / "cache"))
    profile = RunGenerator(worker, span[1:], data).generate_run_profile()
    assert {"Overview", "Operator", "Trace"} <= {view.display_name for view in profile.views}
    assert profile.is_pytorch_lightning
    assert "aten::addmm" in {row["name"] for row in profile.operation_table_by_name["data"]}


@needs_hpu_activity
def test_standalone_use_records_hpu():
    # outside a Trainer there are no steps to schedule: record everything
    profiler = HPUProfiler(schedule=None)
    with profiler.profile("matmul"):
        x = torch.randn(32, 32, device="hpu")
        (x @ x).relu()
    summary = profiler.summary()
    assert summary.startswith("Profiler Report: HPUProfiler, HPU (")
    assert "aten::mm" in summary and "[pl][profile]matmul" in summary


def test_argument_checks():
    with pytest.raises(MisconfigurationException, match="NVTX ranges are CUDA's"):
        HPUProfiler(emit_nvtx=True)
    with pytest.raises(MisconfigurationException, match="Found sort_by_key: cuda_time_total"):
        HPUProfiler(sort_by_key="cuda_time_total")
    assert HPUProfiler(sort_by_key="hpu_time_total")._sort_by_key == "hpu_time_total"


@pytest.mark.skipif(_HPU_ACTIVITY, reason="torch 2.7 and later give torch.profiler HPU activity")
def test_records_the_cpu_only_and_warns_where_torch_has_no_hpu_activity(tmp_path, recorded_activities, monkeypatch):
    from lightning.pytorch.utilities.rank_zero import WarningCache

    import pytorch_lightning.profilers.hpu as hpu_profiler

    monkeypatch.setattr(hpu_profiler, "_warning_cache", WarningCache())  # once per process: earlier tests warned
    with pytest.warns(UserWarning, match="`HPUProfiler` records the CPU only: this Intel Gaudi software stack"):
        _trainer(tmp_path, HPUProfiler()).fit(BoringModel())
    assert recorded_activities == [{ProfilerActivity.CPU}]
