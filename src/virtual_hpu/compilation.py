"""Graph compilations of ``torch.compile(backend="hpu_backend")`` on the virtual Gaudi.

The real bridge compiles each graph dynamo hands it (forward and backward separately) into a device recipe; a
recompilation (new shapes, a guard that failed) is one more. The virtual Gaudi runs the graph's ops one by one, so
"compiling" is the bookkeeping the bridge's ``graph_compilation`` metric reports (how many, how long) plus what a
user needs to find the cause: the ops in each graph, its input shapes and dynamo's reason for recompiling.
In lazy mode a graph cut by ``mark_step`` or a host sync counts as a compilation when its shape (its ops and their
input shapes and dtypes) is new, as the bridge compiles it once and then takes it from its cache; so
``graph_compilation`` serves both modes.
"""

import re
import time
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch._dynamo.utils import counters as _dynamo_counters
from torch._dynamo.utils import guard_failures as _guard_failures


@dataclass(frozen=True)
class CompiledGraph:
    """One graph compiled for the device."""

    ops: int  # aten ops in the graph
    input_shapes: tuple
    reason: Optional[str]  # dynamo's guard failure that caused this recompilation; None for a first compilation
    # where the traced code starts: the outermost frame of the first op's stack trace, "file:line in function"
    source: Optional[str] = None


@dataclass
class _Totals:
    time_ns: int = 0
    graphs: list = field(default_factory=list)


_totals = _Totals()
_reasons_seen = 0
_compiled_by_backend = 0  # graphs hpu_backend compiled since activation; never reset
_at_reset = (0, 0)  # (compiled_ever(), graph_breaks_ever()) at the last reset()


def _lazy_compilations() -> int:
    return torch.ops.virtual_hpu.lazy_graph_compilations()


def new_reason() -> Optional[str]:
    """Dynamo's guard failures since the last call, joined: why the graph being captured now is a recompilation."""
    global _reasons_seen
    reasons = [reason for failures in _guard_failures.values() for reason in failures]
    if len(reasons) < _reasons_seen:  # torch._dynamo.reset() emptied them
        _reasons_seen = 0
    fresh, _reasons_seen = reasons[_reasons_seen:], len(reasons)
    return "; ".join(fresh) or None


def record(graph: torch.fx.GraphModule, example_inputs: list, started_ns: int, reason: Optional[str]) -> None:
    """Count one compiled graph."""
    global _compiled_by_backend
    ops = sum(1 for node in graph.graph.nodes if node.op == "call_function")
    shapes = tuple(tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor))
    compiled = CompiledGraph(ops, shapes, reason, _source(graph))
    _totals.graphs.append(compiled)
    _totals.time_ns += time.perf_counter_ns() - started_ns
    _compiled_by_backend += 1
    from virtual_hpu import events

    events.publish(events.Event(events.COMPILATION, compiled))


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _source(graph: torch.fx.GraphModule) -> Optional[str]:
    for node in graph.graph.nodes:
        frames = _FRAME.findall(node.meta.get("stack_trace") or "")
        if frames:
            file, line, function = frames[0]
            return f"{file}:{line} in {function}"
    return None


def compiled_ever() -> int:
    """Graphs compiled since activation, by ``hpu_backend`` and by lazy mode; never reset, for counters that keep
    their own starting point (``virtual_hpu.accounting``)."""
    return _compiled_by_backend + _lazy_compilations()


def graph_breaks_ever() -> int:
    """Graph breaks dynamo took in this process; never reset here."""
    return sum(_dynamo_counters["graph_break"].values())


def totals() -> tuple[int, int]:
    """(graphs compiled, nanoseconds spent) since activation or the last ``reset()``; lazy-mode graphs take no time
    here, as the virtual device does not compile them."""
    return compiled_ever() - _at_reset[0], _totals.time_ns


def graphs() -> list[CompiledGraph]:
    """Each graph ``hpu_backend`` compiled since the last ``reset()``, in order."""
    return list(_totals.graphs)


def graph_breaks() -> int:
    """Graph breaks dynamo took since the last ``reset()`` (each splits a function into graphs)."""
    return graph_breaks_ever() - _at_reset[1]


def reset() -> None:
    """Start the metric's counts again (the bridge's ``metric_global("graph_compilation").reset()``)."""
    global _totals, _at_reset
    _totals = _Totals()
    _at_reset = (compiled_ever(), graph_breaks_ever())
    new_reason()
