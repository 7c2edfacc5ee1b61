"""A report of what will make training steps slow on Gaudi: host syncs, recompilations and CPU fallbacks."""

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

import pytorch_lightning as pl
from pytorch_lightning.accelerators.hpu import HPUAccelerator
from pytorch_lightning.callbacks import _hpu_hazards as hazards

# `PL_HPU_PERFORMANCE_REPORT=1` adds the callback to every HPU Trainer, without a code change
ENVIRONMENT_FLAG = "PL_HPU_PERFORMANCE_REPORT"
_VIRTUAL_ONLY = (
    "host syncs, the source lines of hazards and what changed at a recompilation are recorded on the virtual Gaudi"
    " only: run the script with VIRTUAL_HPU=1 on a machine without Gaudi to see them"
)


@dataclass
class PerformanceReport:
    """The findings of one fit: per rank, the training steps seen, the graph compilations and CPU fallbacks counted by
    the bridge, and each hazard with its source and fix."""

    device: str
    mode: str
    steps: dict = field(default_factory=dict)  # rank -> training steps
    compilations: dict = field(default_factory=dict)  # rank -> graph compilations during the training epochs
    cpu_fallbacks: dict = field(default_factory=dict)  # rank -> ops that fell back to the CPU
    hazards: dict = field(default_factory=dict)  # rank -> [Hazard]
    virtual: bool = True
    warmup_steps: int = 0  # host syncs are looked for after these

    @property
    def clean(self) -> bool:
        return not any(self.hazards.values()) and not any(self.cpu_fallbacks.values())

    def __str__(self) -> str:
        ranks = sorted(self.steps)
        steps = self.steps[ranks[0]] if ranks else 0
        title = (
            f"HPU performance report ({self.device}, {self.mode} mode, {len(ranks)} rank(s), {steps} training steps)"
        )
        if self.clean and self.virtual:
            return f"{title}: clean, no host syncs, recompilations or CPU fallbacks in the training steps."
        lines = [title]
        for rank in ranks:
            prefix = f"rank {rank}: " if len(ranks) > 1 else ""
            for hazard in self.hazards.get(rank, []):
                looked = self.steps[rank] - (self.warmup_steps if hazard.kind == hazards.HOST_SYNC else 0)
                per_step = hazard.count / max(looked, 1)
                lines.append(f"  {prefix}{hazard.kind}: {hazard.count} ({per_step:.2f} per step) at {hazard.where}")
                if hazard.code:
                    lines.append(f"      {hazard.code}")
                for detail in hazard.details:
                    lines.append(f"      {detail}")
                lines.append(f"      steps {', '.join(map(str, hazard.steps))}{'...' if hazard.count > 5 else ''}")
                lines.append(f"      fix: {hazard.fix}")
            if self.cpu_fallbacks.get(rank):
                lines.append(
                    f"  {prefix}{hazards.CPU_FALLBACK}: {self.cpu_fallbacks[rank]} ops ran on the CPU; fix: replace the"
                    " ops the bridge's fallback log names (PT_HPU_LOGGING) or move them out of the step"
                )
            lines.append(f"  {prefix}graph compilations during training: {self.compilations.get(rank, 0)}")
        if not self.virtual:
            lines.append(f"  ({_VIRTUAL_ONLY})")
        return os.linesep.join(lines)


class HPUPerformanceMonitor(Callback):
    """Finds, during ``fit``, what makes training steps slow on Gaudi, and says where it comes from.

    Per training step it counts host syncs (``.item()``, printing a tensor, a Python ``if`` on a device value, Lightning
    reading a value logged every step), graph recompilations (a smaller last batch, shapes that change, shapes that
    depend on the data) and ops that fall back to the CPU. On the virtual Gaudi it also names the user's source line of
    each host sync, and for each recompilation the step, the batch shapes before and after, and ``torch.compile``'s
    reason. On a real Gaudi it reads the bridge's ``graph_compilation`` and ``cpu_fallback`` metrics at epoch ends.

    Each epoch it logs ``hpu/host_syncs_per_step``, ``hpu/recompilations``, ``hpu/graph_compilations`` and
    ``hpu/cpu_fallbacks`` to the Trainer's loggers; at the end of ``fit`` rank 0 prints the report of every rank, which
    :meth:`report` returns for programs. Pass it in ``callbacks``, or set ``PL_HPU_PERFORMANCE_REPORT=1``. With
    :class:`~pytorch_lightning.profilers.HPUProfiler`, the profiler's summary includes the report.

    Args:
        warmup_steps: the first training steps of ``fit``, which build the step's graphs for the first time (and, with
            several processes, DDP's buckets): host syncs in them are not hazards, and in lazy mode a compilation after
            them is a recompilation. ``torch.compile`` says itself when it compiles a function again.
        verbose: print the report at the end of ``fit``.
    """

    def __init__(self, warmup_steps: int = 2, verbose: bool = True) -> None:
        self.warmup_steps = warmup_steps
        self.verbose = verbose
        self._report: Optional[PerformanceReport] = None
        self._unsubscribe: Optional[Callable[[], None]] = None
        self._in_step = False
        self._step = -1
        self._last_batch = False
        self._signatures: tuple = ("", "")  # the batch shapes of the previous step and of this one
        self._hazards: dict = {}
        self._host_syncs = 0
        self._epoch_start: dict = {}
        self._step_source = "the training step"

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if stage != "fit":
            return
        if not isinstance(trainer.accelerator, HPUAccelerator):
            rank_zero_warn(
                f"`{type(self).__name__}` reports on HPUs; with `{type(trainer.accelerator).__name__}` it does nothing."
            )
            return
        virtual = HPUAccelerator.is_virtual()
        mode = "lazy" if HPUAccelerator.is_lazy() else "eager"
        self._report = PerformanceReport(
            device=HPUAccelerator.describe(), mode=mode, virtual=virtual, warmup_steps=self.warmup_steps
        )
        self._hazards, self._host_syncs, self._step, self._signatures = {}, 0, -1, ("", "")
        self._step_source = hazards.function_where(type(pl_module).training_step)
        if virtual:
            from virtual_hpu import events

            self._unsubscribe = events.subscribe(self._on_event)
        profiler = trainer.profiler
        if hasattr(profiler, "attach_report"):
            profiler.attach_report(lambda: str(self._report) if self._report is not None else "")

    @override
    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self._report is not None:
            self._epoch_start = {
                **_bridge_counts(),
                "steps": self._step,
                "host_syncs": self._host_syncs,
                "recompilations": self._recompilations(),
            }

    @override
    def on_train_batch_start(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any, batch_idx: int
    ) -> None:
        if self._report is None or not self._report.virtual:
            return
        self._step += 1
        self._in_step = True
        self._last_batch = batch_idx == trainer.num_training_batches - 1
        self._signatures = (self._signatures[1], hazards.batch_signature(batch))

    @override
    def on_validation_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._in_step = False

    @override
    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._in_step = False
        if self._report is None or not self._epoch_start:
            return
        counts = _bridge_counts()
        steps = max(self._step - self._epoch_start["steps"], 1)
        metrics = {
            "hpu/graph_compilations": counts["compilations"] - self._epoch_start["compilations"],
            "hpu/cpu_fallbacks": counts["cpu_fallbacks"] - self._epoch_start["cpu_fallbacks"],
        }
        if self._report.virtual:
            metrics["hpu/host_syncs_per_step"] = (self._host_syncs - self._epoch_start["host_syncs"]) / steps
            metrics["hpu/recompilations"] = self._recompilations() - self._epoch_start["recompilations"]
        self._report.compilations[0] = self._report.compilations.get(0, 0) + metrics["hpu/graph_compilations"]
        self._report.cpu_fallbacks[0] = self._report.cpu_fallbacks.get(0, 0) + metrics["hpu/cpu_fallbacks"]
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.fit_loop.epoch_loop._batches_that_stepped)

    @override
    def on_fit_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._stop_listening()
        if self._report is None:
            return
        report = self._report
        report.steps = {0: self._step + 1 if report.virtual else trainer.fit_loop.epoch_loop._batches_that_stepped}
        report.hazards = {0: sorted(self._hazards.values(), key=lambda hazard: -hazard.count)}
        if trainer.world_size > 1:
            _gather_ranks(report)
        if self.verbose:
            rank_zero_info(str(report))

    @override
    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        self._stop_listening()

    def report(self) -> Optional[PerformanceReport]:
        """The findings of the last ``fit``, every rank's (each rank holds them all); None before a fit on HPUs."""
        return self._report

    def _on_event(self, event: Any) -> None:
        if not self._in_step:
            return
        if event.kind == "host_sync":
            self._host_syncs += 1
            if self._step < self.warmup_steps:  # one-time reads of the first steps (DDP building its buckets)
                return
            found = hazards.host_sync_hazard(sys._getframe(1))
            self._hazards.setdefault((found.kind, found.where), found).record(self._step)
        elif _is_recompilation(event.graph, self._step, self.warmup_steps):
            before, after = self._signatures
            graph = event.graph
            # a lazy graph is cut by Lightning (mark_step) or a host sync: it is the graph the training step built
            where = hazards.short_source(graph.source) if graph is not None and graph.source else self._step_source
            found = hazards.recompilation_hazard(where, before, after, self._last_batch)
            detail = f"batch shapes {before} -> {after}" if before != after else f"batch shapes {after}"
            if graph is not None and graph.reason:
                # dynamo's first line says what changed; the rest repeats the stack
                detail += f"; torch.compile: {graph.reason.splitlines()[0].split('  #')[0].strip()}"
            self._hazards.setdefault((found.kind, found.where, found.fix), found).record(self._step, detail)

    def _recompilations(self) -> int:
        return sum(h.count for h in self._hazards.values() if h.kind == hazards.RECOMPILATION)

    def _stop_listening(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._in_step = False


def _is_recompilation(graph: Any, step: int, warmup_steps: int) -> bool:
    """``torch.compile`` says why it compiles a function again (after the first step, which may compile a function
    called twice in it twice); lazy mode compiles each new graph shape, and the first steps build new graphs (the
    optimizer's state appears in the second)."""
    if graph is not None:
        return graph.reason is not None and step >= 1
    return step >= warmup_steps


def _bridge_counts() -> dict:
    from habana_frameworks.torch.hpu.metrics import metric_global

    def total(name: str) -> int:
        return int(dict(metric_global(name).stats())["TotalNumber"])

    return {"compilations": total("graph_compilation"), "cpu_fallbacks": total("cpu_fallback")}


def _gather_ranks(report: PerformanceReport) -> None:
    """Every rank's findings into the report (all ranks take part; rank 0 prints them)."""
    own = (report.steps[0], report.compilations.get(0, 0), report.cpu_fallbacks.get(0, 0), report.hazards[0])
    gathered: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, own)
    for index, (steps, compilations, fallbacks, found) in enumerate(gathered):
        report.steps[index], report.compilations[index] = steps, compilations
        report.cpu_fallbacks[index], report.hazards[index] = fallbacks, found
