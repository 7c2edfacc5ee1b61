"""Profiler for Intel Gaudi devices (HPUs)."""

import importlib.util
import os
import textwrap
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
from lightning.pytorch.profilers.pytorch import _KINETO_AVAILABLE, PyTorchProfiler, ScheduleWrapper
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import WarningCache, rank_zero_warn
from torch.profiler import ProfilerActivity, tensorboard_trace_handler
from typing_extensions import override

from pytorch_lightning.accelerators.hpu import HPUAccelerator

_warning_cache = WarningCache()
# torch.profiler has HPU activity from torch 2.7 (virtual_hpu.torch_support.PROFILER_HAS_HPU_ACTIVITY); PyPI's 2.6 has
# none, and there the profiler records the CPU only
_HPU_ACTIVITY: Optional[ProfilerActivity] = getattr(ProfilerActivity, "HPU", None)

# ``sort_by_key`` orders the summary's ranking it names; torch calls HPU time "device time"
_CPU_SORT_KEYS = {
    "cpu_time",
    "cpu_time_total",
    "self_cpu_time_total",
    "cpu_memory_usage",
    "self_cpu_memory_usage",
    "count",
}
_HPU_SORT_KEYS = {"hpu_time", "hpu_time_total", "self_hpu_time_total"}
_KEY_DESCRIPTIONS = {
    "self_cpu_time_total": "self CPU time",
    "cpu_time_total": "total CPU time (including children)",
    "cpu_time": "average CPU time per call",
    "cpu_memory_usage": "CPU memory (including children)",
    "self_cpu_memory_usage": "self CPU memory",
    "count": "number of calls",
    "self_hpu_time_total": "self HPU time",
    "hpu_time_total": "total HPU time (including children)",
    "hpu_time": "average HPU time per call",
}
_NAME_WIDTH = 80

_LAZY_MODE_NOTE = (
    "Note: lazy mode is on (PT_HPU_LAZY_MODE=1). Operators are queued and run as a graph at each mark_step; the"
    " profiler measures them synchronously, so per-operator HPU times approximate the device's asynchronous"
    " execution and wall-clock times are longer than without profiling. Use them to find bottlenecks; measure"
    " end-to-end time with the SimpleProfiler."
)

# torch's Python tracer (``with_stack``) keeps pointers to code objects; ones freed while profiling (by saving a
# checkpoint, for instance) leave names torch cannot decode when it reads the events back
_UNREADABLE_EVENTS = (
    "`HPUProfiler` wrote the trace, but torch could not read back the recorded events for the summary and stack"
    " files: with `with_stack=True` (or `export_to_flame_graph=True`) torch fails on Python code objects freed while"
    " profiling, e.g. by saving a checkpoint. Profile without stacks, or keep checkpointing out of the profiled steps."
)


class HPUProfiler(PyTorchProfiler):
    r"""PyTorch's profiler with Intel Gaudi activity: HPU operators and HPU memory next to the CPU side.

    Use it as ``Trainer(accelerator="hpu", profiler=HPUProfiler())``, or ``profiler="hpu"``. Like
    :class:`~lightning.pytorch.profilers.PyTorchProfiler`, it writes a Chrome/TensorBoard trace per stage and rank,
    ``<dirpath>/<stage>[-<filename>][-<local_rank>]-<action>.<time_ns>.pt.trace.json``, with ``dirpath`` defaulting to
    the Trainer's ``log_dir``. With a ``filename`` each rank also writes its :meth:`summary` to
    ``<dirpath>/<stage>-<filename>[-<local_rank>].txt``. Custom ranges recorded with ``profile(name)`` or
    ``start(name)``/``stop(name)`` appear in the trace as ``[pl][profile]<name>``.

    What is recorded follows the accelerator of the run: on HPUs, ``ProfilerActivity.HPU`` and tensor memory next to
    the CPU; on any other accelerator, the CPU only. Outside a Trainer it records HPU activity whenever a Gaudi is
    present.

    Args:
        dirpath: Directory for traces and reports; ``None`` means the Trainer's ``log_dir``.
        filename: Name part of the files; with it, :meth:`summary` goes to a file per rank instead of the log.
        group_by_input_shapes: Rank operators per input shapes (needs ``record_shapes=True``).
        export_to_chrome: Write the Chrome/TensorBoard trace.
        row_limit: Rows of each ranking in :meth:`summary`; ``-1`` for all.
        sort_by_key: Order of the summary's CPU ranking (``self_cpu_time_total`` by default, ``cpu_time_total``,
            ``cpu_time``, ``cpu_memory_usage``, ``self_cpu_memory_usage``, ``count``) or of its HPU ranking
            (``self_hpu_time_total`` by default, ``hpu_time_total``, ``hpu_time``).
        record_module_names: Label each submodule's forward in the trace.
        profile_memory: Record tensor allocations; ``None`` records them whenever HPU activity is recorded.
        record_shapes: Record operator input shapes.
        with_stack: Record the Python stack of each operator.
        export_to_flame_graph: Also write ``<stage>[-<filename>][-<local_rank>]-<action>.stack`` files, the input of
            flame-graph tools (implies ``with_stack``); ``metric`` (``self_cpu_time_total`` by default, or
            ``self_hpu_time_total``) chooses what they count.
        \**profiler_kwargs: Further arguments of :class:`torch.profiler.profile` (``schedule``, ``with_flops``,
            ``activities``, ``on_trace_ready``, ...).

    Raises:
        MisconfigurationException: for ``emit_nvtx`` (NVTX is CUDA's), or an unknown ``sort_by_key``.
        ModuleNotFoundError: if this torch build lacks the Kineto profiler.
    """

    AVAILABLE_SORT_KEYS = _CPU_SORT_KEYS | _HPU_SORT_KEYS

    def __init__(
        self,
        dirpath: Optional[Union[str, Path]] = None,
        filename: Optional[str] = None,
        group_by_input_shapes: bool = False,
        export_to_chrome: bool = True,
        row_limit: int = 20,
        sort_by_key: Optional[str] = None,
        record_module_names: bool = True,
        profile_memory: Optional[bool] = None,
        record_shapes: bool = False,
        with_stack: bool = False,
        export_to_flame_graph: bool = False,
        **profiler_kwargs: Any,
    ) -> None:
        emit_nvtx = profiler_kwargs.pop("emit_nvtx", False)
        # what the user fixed; the rest is decided per accelerator when profiling starts
        self._requested_activities = profiler_kwargs.get("activities")
        self._requested_profile_memory = profile_memory
        profiler_kwargs.update(record_shapes=record_shapes, with_stack=with_stack)
        if export_to_flame_graph:
            profiler_kwargs["export_to_flame_graph"] = True
            # torch keeps Python stacks in its events only in verbose mode; without it the stack files stay empty
            profiler_kwargs.setdefault("experimental_config", torch.profiler._ExperimentalConfig(verbose=True))
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            group_by_input_shapes=group_by_input_shapes,
            export_to_chrome=export_to_chrome,
            row_limit=row_limit,
            sort_by_key=sort_by_key or "self_cpu_time_total",
            record_module_names=record_module_names,
            **profiler_kwargs,
        )
        # checked once the base profiler is built, so that the half-made object can still be torn down
        if not _KINETO_AVAILABLE:
            raise ModuleNotFoundError("`HPUProfiler` needs a torch build with the Kineto profiler.")
        if emit_nvtx:
            raise MisconfigurationException(
                "`HPUProfiler(emit_nvtx=True)` is not supported: NVTX ranges are CUDA's. Use `PyTorchProfiler` on GPUs."
            )
        # traces are written by ``_write_trace`` unless the user brings an ``on_trace_ready``
        self._writes_traces = not self._has_on_trace_ready
        self._has_on_trace_ready = True
        self._performance_report: Optional[Callable[[], str]] = None

    def attach_report(self, report: Callable[[], str]) -> None:
        """Append ``report()`` to :meth:`summary`; :class:`~pytorch_lightning.callbacks.HPUPerformanceMonitor` attaches
        its findings this way when both are used."""
        self._performance_report = report

    @override
    def start(self, action_name: str) -> None:
        schedule = self._profiler_kwargs.get("schedule")
        if self.profiler is None and self._schedule is None and isinstance(schedule, ScheduleWrapper):
            # A stage with fewer than five steps swaps the step schedule for "always record". Give the next stage the
            # step schedule back, fresh, or it would run on the previous stage's leftover state and record nothing.
            schedule.reset()
            self._schedule = schedule
        super().start(action_name)

    @override
    def setup(self, stage: str, local_rank: Optional[int] = None, log_dir: Optional[str] = None) -> None:
        super().setup(stage, local_rank=local_rank, log_dir=log_dir)
        # The Trainer profiles a hook or two before it hands over the module, so the session may have been opened
        # before the accelerator was known. The step schedule records nothing before the first step: reopen it with
        # the activities this run calls for.
        if self.profiler is not None and self._requested_activities is None:
            if set(self._profiler_kwargs["activities"]) != set(self._default_activities()):
                self.profiler.__exit__(None, None, None)
                self.profiler = None
                self._create_profilers()
                self.profiler = self.profiler.__enter__() or self.profiler

    @override
    def _default_activities(self) -> list[ProfilerActivity]:
        if not self._profiles_hpu():
            return [ProfilerActivity.CPU]
        if not _hpu_activity_supported():
            _warning_cache.warn(
                "`HPUProfiler` records the CPU only: this Intel Gaudi software stack does not offer"
                " `ProfilerActivity.HPU` to torch.profiler."
            )
            return [ProfilerActivity.CPU]
        return [ProfilerActivity.CPU, _HPU_ACTIVITY]

    def _profiles_hpu(self) -> bool:
        """Whether the run being profiled is on HPUs; outside a Trainer, whether a Gaudi is present."""
        try:
            trainer = getattr(self._lightning_module, "_trainer", None)
        except ReferenceError:  # the module the Trainer handed us is gone
            trainer = None
        if trainer is not None:
            return isinstance(trainer.accelerator, HPUAccelerator)
        return HPUAccelerator.is_available()

    @override
    def _create_profiler(self, profiler: type) -> Any:
        activities = self._requested_activities or self._default_activities()
        profile_memory = self._requested_profile_memory
        if profile_memory is None:
            profile_memory = _HPU_ACTIVITY is not None and _HPU_ACTIVITY in activities
        self._profiler_kwargs.update(activities=activities, profile_memory=profile_memory)
        return super()._create_profiler(profiler)

    @override
    def stop(self, action_name: str) -> None:
        if self._writes_traces and self.profiler is not None and action_name.endswith(tuple(self.STEP_FUNCTIONS)):
            # files are named after the step that completes the recording
            self.profiler.on_trace_ready = partial(self._write_trace, action_name)
        super().stop(action_name)

    def _write_trace(self, action_name: str, profiler: torch.profiler.profile) -> None:
        """Write the Chrome/TensorBoard trace and, if asked, the flame-graph stacks of a finished recording."""
        if self.dirpath is None:
            rank_zero_warn("`HPUProfiler` could not write its trace: it has no `dirpath` and the Trainer no `log_dir`.")
            return
        name = self._prepare_filename(action_name=action_name, extension="")
        if self._export_to_chrome:
            tensorboard_trace_handler(str(self.dirpath), name)(profiler)
        if self._export_to_flame_graph:
            os.makedirs(self.dirpath, exist_ok=True)
            # torch names device time after CUDA here, and reads it from whichever device was profiled
            metric = self._metric.replace("hpu", "cuda")
            try:
                profiler.export_stacks(os.path.join(self.dirpath, f"{name}.stack"), metric=metric)
            except UnicodeDecodeError:
                _warning_cache.warn(_UNREADABLE_EVENTS)

    @override
    def _cache_functions_events(self) -> None:
        if isinstance(self.profiler, torch.profiler.profile) and self.profiler.profiler is None:
            # the schedule never started a recording (a stage that ran no step): there are no events to read
            self.function_events = None
            return
        try:
            super()._cache_functions_events()
        except UnicodeDecodeError:
            self.function_events = None
            _warning_cache.warn(_UNREADABLE_EVENTS)

    def __deepcopy__(self, memo: dict) -> "HPUProfiler":
        # a handle on one profiling session: copies share it (``save_hyperparameters`` deep-copies its arguments)
        return self

    def __getstate__(self) -> dict[str, Any]:
        # Refusing keeps it out of a LightningModule's saved hyperparameters (Lightning drops what cannot be pickled):
        # checkpoints must not name ``pytorch_lightning`` classes, upstream's loader redirects them to
        # ``lightning.pytorch``. A live profiling session cannot travel to another process either.
        raise TypeError(
            f"`{type(self).__name__}` cannot be pickled: it holds a profiling session. Pass it to the Trainer, keep it"
            " out of `save_hyperparameters` (`ignore=['profiler']`), and profile several processes with"
            " `strategy='hpu_parallel'`, which starts them from the script."
        )

    @override
    def summary(self) -> str:
        """Rank the operators by HPU time and by CPU time, then list the recorded ranges.

        HPU time is the device time the Gaudi profiler reports for an operator; the virtual Gaudi runs operators on
        the host, so there their time shows as CPU time. Ranges are Lightning's hooks, the modules' forwards and custom
        actions.
        """
        if not self._profiler_kwargs.get("enabled", True):
            return ""
        self._delete_profilers()
        if not self.function_events:
            return ""

        averages = self.function_events.key_averages(group_by_input_shapes=self._group_by_input_shapes)
        operators = [event for event in averages if not getattr(event, "is_user_annotation", False)]
        ranges = [event for event in averages if getattr(event, "is_user_annotation", False)]
        hpu = _HPU_ACTIVITY is not None and _HPU_ACTIVITY in (self._profiler_kwargs.get("activities") or [])
        cpu_key = self._sort_by_key if self._sort_by_key in _CPU_SORT_KEYS else "self_cpu_time_total"
        hpu_key = self._sort_by_key if self._sort_by_key in _HPU_SORT_KEYS else "self_hpu_time_total"

        lines = [self._report_title(hpu)]
        if hpu:
            lines += [f"Top operators by {_KEY_DESCRIPTIONS[hpu_key]}", self._hpu_ranking(operators, hpu_key)]
        # HPU columns only where the Gaudi profiler reported device time
        hpu_timed = hpu and any(event.device_time_total > 0 for event in operators)
        lines += [f"Top operators by {_KEY_DESCRIPTIONS[cpu_key]}", self._ranking(operators, cpu_key, hpu_timed)]
        if ranges:
            lines += ["Recorded ranges (Lightning hooks, module forwards, custom actions) by total time"]
            lines += [_ranges_table(ranges, self._row_limit)]
        if hpu and _is_lazy():
            lines += textwrap.wrap(_LAZY_MODE_NOTE, width=_NAME_WIDTH + 40)
        if self._performance_report is not None:
            lines.append(self._performance_report())
        return os.linesep.join(lines)

    def _report_title(self, hpu: bool) -> str:
        stage = f"{self._stage.upper()} " if self._stage is not None else ""
        rank = f", rank {self._local_rank}" if self._local_rank is not None else ""
        if hpu:
            mode = "lazy" if _is_lazy() else "eager"
            where = f"HPU ({HPUAccelerator.describe()}, {mode} mode) and CPU"
        else:
            where = "CPU only"
        return f"{stage}Profiler Report: HPUProfiler{rank}, {where}"

    def _hpu_ranking(self, operators: list, key: str) -> str:
        timed = [event for event in operators if event.device_time_total > 0]
        if timed:
            return self._ranking(timed, key, hpu=True)
        if HPUAccelerator.is_virtual():
            return (
                "(no HPU device time: the virtual Gaudi runs HPU operators on the host, so their time is in the CPU"
                " ranking below and their memory in the trace)"
            )
        return "(the Intel Gaudi profiler reported no HPU device time for this run)"

    def _ranking(self, operators: list, key: str, hpu: bool) -> str:
        attribute = key.replace("hpu", "device")
        rows = sorted(operators, key=lambda event: getattr(event, attribute), reverse=True)
        columns: list[tuple[str, Callable[[Any], str]]] = [
            ("Calls", lambda event: str(event.count)),
            ("Self CPU", lambda event: _format_us(event.self_cpu_time_total)),
            ("CPU total", lambda event: _format_us(event.cpu_time_total)),
        ]
        if hpu:
            columns += [
                ("Self HPU", lambda event: _format_us(event.self_device_time_total)),
                ("HPU total", lambda event: _format_us(event.device_time_total)),
            ]
        if "memory" in key:
            columns += [
                ("Self CPU Mem", lambda event: _format_bytes(event.self_cpu_memory_usage)),
                ("CPU Mem", lambda event: _format_bytes(event.cpu_memory_usage)),
            ]
        table = _table([self._row_name(event) for event in rows], rows, columns, self._row_limit)
        totals = f"Self CPU time total: {_format_us(sum(event.self_cpu_time_total for event in operators))}"
        if hpu:
            totals += f", self HPU time total: {_format_us(sum(event.self_device_time_total for event in operators))}"
        return os.linesep.join([table, totals])

    def _row_name(self, event: Any) -> str:
        if self._group_by_input_shapes and event.input_shapes:
            return f"{event.key} {event.input_shapes}"
        return event.key


def _ranges_table(ranges: list, limit: int) -> str:
    """Ranges overlap and nest, so self times and shares say little about them: calls and totals only."""
    # the profiler's own step markers say nothing about the run
    rows = [event for event in ranges if not event.key.startswith("ProfilerStep")]
    rows.sort(key=lambda event: event.cpu_time_total, reverse=True)
    columns: list[tuple[str, Callable[[Any], str]]] = [
        ("Calls", lambda event: str(event.count)),
        ("Total", lambda event: _format_us(event.cpu_time_total)),
        ("Average", lambda event: _format_us(event.cpu_time_total / max(event.count, 1))),
    ]
    return _table([event.key for event in rows], rows, columns, limit)


def _table(
    names: list[str], rows: Sequence[Any], columns: Sequence[tuple[str, Callable[[Any], str]]], limit: int
) -> str:
    if limit >= 0:
        names, rows = names[:limit], rows[:limit]
    names = [name if len(name) <= _NAME_WIDTH else name[: _NAME_WIDTH - 3] + "..." for name in names]
    name_width = max(len(name) for name in ["Name", *names])
    cells = [[render(row) for _, render in columns] for row in rows]
    widths = [max(len(header), *(len(line[i]) for line in cells)) for i, (header, _) in enumerate(columns)]
    header = "  ".join(
        [f"{'Name':<{name_width}}"] + [f"{title:>{width}}" for (title, _), width in zip(columns, widths)]
    )
    lines = [header, "-" * len(header)]
    for name, line in zip(names, cells):
        lines.append("  ".join([f"{name:<{name_width}}"] + [f"{cell:>{width}}" for cell, width in zip(line, widths)]))
    return os.linesep.join(lines)


def _format_us(microseconds: float) -> str:
    if abs(microseconds) >= 1e6:
        return f"{microseconds / 1e6:.3f}s"
    if abs(microseconds) >= 1e3:
        return f"{microseconds / 1e3:.3f}ms"
    return f"{microseconds:.3f}us"


def _format_bytes(size: float) -> str:
    for unit in ("B", "KB", "MB"):
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return f"{size:.2f} GB"


def _hpu_activity_supported() -> bool:
    if importlib.util.find_spec("habana_frameworks") is None:
        return False
    # loading the bridge is what registers HPU activity with torch.profiler
    import habana_frameworks.torch.core  # noqa: F401

    return _HPU_ACTIVITY is not None and _HPU_ACTIVITY in torch.profiler.supported_activities()


def _is_lazy() -> bool:
    if not HPUAccelerator.is_available():
        return False
    import habana_frameworks.torch.core as htcore

    return bool(htcore.is_lazy())
