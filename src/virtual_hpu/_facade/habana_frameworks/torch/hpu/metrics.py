"""``habana_frameworks.torch.hpu.metrics``: the bridge's process-wide counters, read the way Gaudi users read them.

``metric_global("graph_compilation").stats()`` gives ``[("TotalNumber", n), ("TotalTime", us), ("AvgTime", us)]``;
``"cpu_fallback"`` gives ``[("TotalNumber", n), ("FallbackOps", {op: count})]``: the virtual Gaudi runs every op on
the device, so it never falls back. ``metric_localcontext(name)`` counts only what runs inside its ``with`` block.
"""

from contextlib import contextmanager
from typing import Any, Iterator

from virtual_hpu import compilation

METRIC_NAMES = ("graph_compilation", "cpu_fallback")


def _raw(name: str) -> tuple[int, int]:
    if name == "graph_compilation":
        return compilation.totals()
    return 0, 0


def _stats(name: str, number: int, time_ns: int) -> list[tuple[str, Any]]:
    if name == "cpu_fallback":
        return [("TotalNumber", number), ("FallbackOps", {})]
    total_us = time_ns // 1000
    return [("TotalNumber", number), ("TotalTime", total_us), ("AvgTime", total_us // number if number else 0)]


def _check(name: str) -> None:
    if name not in METRIC_NAMES:
        raise ValueError(f"Unknown metric {name!r}: the virtual Gaudi has {', '.join(map(repr, METRIC_NAMES))}")


class GlobalMetric:
    """A metric counted since the process started or since its last ``reset()``."""

    def __init__(self, name: str) -> None:
        _check(name)
        self.name = name

    def stats(self) -> list[tuple[str, Any]]:
        return _stats(self.name, *_raw(self.name))

    def reset(self) -> None:
        if self.name == "graph_compilation":
            compilation.reset()


class LocalMetric:
    """A metric counted from the start of a ``metric_localcontext`` block."""

    def __init__(self, name: str) -> None:
        _check(name)
        self.name = name
        self._start = _raw(name)

    def stats(self) -> list[tuple[str, Any]]:
        number, time_ns = _raw(self.name)
        return _stats(self.name, number - self._start[0], time_ns - self._start[1])


def metric_global(name: str) -> GlobalMetric:
    return GlobalMetric(name)


@contextmanager
def metric_localcontext(name: str) -> Iterator[LocalMetric]:
    yield LocalMetric(name)
