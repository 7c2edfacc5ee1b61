"""Graph compilations of ``torch.compile(backend="hpu_backend")`` on the virtual Gaudi.

The real bridge compiles each graph dynamo hands it (forward and backward separately) into a device recipe; a
recompilation (new shapes, a guard that failed) is one more. The virtual Gaudi runs the graph's ops one by one, so
"compiling" is only the bookkeeping the bridge's ``graph_compilation`` metric reports: how many, and how long.
"""

import time
from dataclasses import dataclass, field

import torch


@dataclass
class _Totals:
    number: int = 0
    time_ns: int = 0
    shapes: list = field(default_factory=list)


_totals = _Totals()


def record(graph: torch.fx.GraphModule, example_inputs: list, started_ns: int) -> None:
    """Count one compiled graph, with its input shapes for the record."""
    _totals.number += 1
    _totals.time_ns += time.perf_counter_ns() - started_ns
    _totals.shapes.append([tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)])


def totals() -> tuple[int, int]:
    """(graphs compiled, nanoseconds spent) since activation or the last ``reset()``."""
    return _totals.number, _totals.time_ns


def input_shapes() -> list:
    """Input shapes of each graph compiled since the last ``reset()``, in order."""
    return list(_totals.shapes)


def reset() -> None:
    global _totals
    _totals = _Totals()
