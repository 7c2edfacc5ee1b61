"""Graph cuts in lazy mode, and closures that run after the next cut (``htcore.add_step_closure``): a script reads a
loss's value there, once the graph that computes it has run, without a host sync of its own."""

import threading
from typing import Any, Callable, Sequence

import torch

from habana_frameworks.torch.utils.internal import is_lazy, lazy_only

# closures waiting for the next cut, per device: the bridge keeps them with the default device's context
_CLOSURES: dict = {}
_CLOSURES_LOCK = threading.Lock()


def _current_device() -> int:
    from habana_frameworks.torch import hpu

    return hpu.current_device()


@lazy_only
def add_step_closure(closure: Callable[..., Any], args: Sequence[Any] = ()) -> None:
    """Call ``closure(*args)`` after the next ``mark_step`` or ``iter_mark_step``; in eager mode it is never called,
    as on Gaudi."""
    with _CLOSURES_LOCK:
        _CLOSURES.setdefault(_current_device(), []).append((closure, tuple(args)))


def _run_step_closures() -> None:
    with _CLOSURES_LOCK:
        waiting = _CLOSURES.pop(_current_device(), [])
    for closure, args in waiting:
        closure(*args)


@lazy_only
def mark_step(device_str: str = "", sync: bool = False) -> None:
    """Cut the pending lazy graph, then run the step closures. The virtual device runs ops eagerly, so the cut only
    counts; in eager mode this does nothing, as on Gaudi."""
    torch.ops.virtual_hpu.mark_step()
    _run_step_closures()


@lazy_only
def iter_mark_step(device_str: str = "") -> None:
    """``mark_step`` at the end of a training iteration (Gaudi uses the boundary to cache the iteration's graphs)."""
    torch.ops.virtual_hpu.mark_step()
    _run_step_closures()


def _mark_step_if_lazy(device_str: str = "") -> None:
    if is_lazy():
        mark_step(device_str)
