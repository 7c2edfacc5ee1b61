"""Gaudi's autocast op lists given in code: in force at torch's dispatcher while a precision plugin's autocast is."""

import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from virtual_hpu import op_names
from virtual_hpu.autocast import DEFAULT_FP32, DEFAULT_LOWER, FP32_VARIABLE, INPUT_ONLY, LOWER_VARIABLE

_DEVICE = "hpu"


class HPUAutocastOpLists:
    """Which ops ``torch.autocast("hpu")`` runs in lower precision and which in fp32, given in code.

    Gaudi's bridge reads its lists once, when it loads, from the files ``PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST``
    and ``PT_HPU_AUTOCAST_FP32_OPS_LIST`` name (else Intel's documented defaults), and registers a casting kernel for
    each listed op at torch's autocast dispatch key of the device. ``in_force()`` registers kernels of its own there,
    over the bridge's, for each op whose precision the given lists change, and removes them when it ends, which gives
    the bridge's back; ops of a replaced list that the given lists leave out run in the type of their inputs, as Gaudi
    runs unlisted ops. Used by :class:`HPUMixedPrecision` around its autocast; with no list given
    (``None`` for both) nothing is registered and nothing costs.

    Args:
        lower: op names to run in bf16/fp16 (aten names or Gaudi's aliases), replacing the bridge's lower list.
        fp32: op names to run in fp32, replacing the bridge's fp32 list. An op in both runs in lower precision.
    """

    def __init__(self, lower: Optional[Sequence[str]] = None, fp32: Optional[Sequence[str]] = None) -> None:
        self.lower = None if lower is None else op_names.resolve(lower, "The lower-precision op list")
        self.fp32 = None if fp32 is None else op_names.resolve(fp32, "The fp32 op list")
        # the kernel of each op overload, made at the first use (a few milliseconds) and kept for the next
        self._kernels: Optional[list[tuple[str, Callable[..., Any]]]] = None

    @property
    def given(self) -> bool:
        return self.lower is not None or self.fp32 is not None

    @contextmanager
    def in_force(self) -> Iterator[None]:
        """Register the lists' kernels for the length of the block (nothing when no list was given)."""
        if not self.given:
            yield
            return
        if self._kernels is None:
            self._kernels = list(self._make_kernels())
        key, library = _autocast_key(), torch.library.Library("aten", "IMPL")
        try:
            with warnings.catch_warnings():
                # torch warns once per process that a kernel overrides the bridge's: that is the point
                warnings.filterwarnings("ignore", message=".*overrid", category=UserWarning)
                for overload, kernel in self._kernels:
                    library.impl(overload, kernel, key)
            yield
        finally:
            # drops these registrations only; the bridge's come back
            library._destroy()

    def _make_kernels(self) -> Iterator[tuple[str, Callable[..., Any]]]:
        bridge_lower, bridge_fp32 = _bridge_lists()
        lower = bridge_lower if self.lower is None else self.lower
        fp32 = bridge_fp32 if self.fp32 is None else self.fp32
        for name in dict.fromkeys((*lower, *fp32, *bridge_lower, *bridge_fp32)):
            policy = _policy(name, lower, fp32)
            if policy == _policy(name, bridge_lower, bridge_fp32):
                continue  # the bridge's kernel does the same
            packet = getattr(torch.ops.aten, name)
            for overload in op_names.overloads(name):
                op = getattr(packet, overload.partition(".")[2] or "default")
                yield overload, _kernel(op, policy, first_only=name in INPUT_ONLY)


def _policy(name: str, lower: Sequence[str], fp32: Sequence[str]) -> str:
    # an op in both lists runs in lower precision, as on Gaudi
    return "lower" if name in lower else "fp32" if name in fp32 else "input"


def _autocast_key() -> str:
    # "hpu" is torch's HPU device type under Intel's PyTorch builds, and torch's PrivateUse1 backend renamed "hpu"
    # where the bridge loads as a plugin of stock PyTorch (and the virtual Gaudi on PyPI's builds)
    return "AutocastPrivateUse1" if torch._C._get_privateuse1_backend_name() == _DEVICE else "AutocastHPU"


def _bridge_lists() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The lists the bridge read when it loaded: the files its variables name, else Intel's documented defaults."""
    return _listed(LOWER_VARIABLE, DEFAULT_LOWER), _listed(FP32_VARIABLE, DEFAULT_FP32)


def _listed(variable: str, default: tuple[str, ...]) -> tuple[str, ...]:
    path = os.environ.get(variable)
    if not path:
        return default
    return op_names.resolve(Path(path).read_text().splitlines(), f"{variable}={path!r}")


def _kernel(op: Callable[..., Any], policy: str, first_only: bool) -> Callable[..., Any]:
    """A casting kernel for ``op``: its floating-point hpu tensors to the autocast type (``"lower"``), to fp32
    (``"fp32"``) or left as they are (``"input"``), then the op below autocast, as torch's own autocast kernels do."""

    def cast_and_call(*args: Any, **kwargs: Any) -> Any:
        if policy != "input":
            to = torch.get_autocast_dtype(_DEVICE) if policy == "lower" else torch.float32
            args = _cast(args, to, first_only)
        enabled = torch.is_autocast_enabled(_DEVICE)
        torch.set_autocast_enabled(_DEVICE, False)
        try:
            return op(*args, **kwargs)
        finally:
            torch.set_autocast_enabled(_DEVICE, enabled)

    return cast_and_call


def _cast(args: tuple[Any, ...], to: torch.dtype, first_only: bool) -> tuple[Any, ...]:
    cast: list[Any] = []
    done = False
    for value in args:
        if not done and isinstance(value, torch.Tensor):
            value, done = _eligible_cast(value, to), first_only
        elif not done and isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            value, done = type(value)(_eligible_cast(v, to) for v in value), first_only
        cast.append(value)
    return tuple(cast)


def _eligible_cast(value: Any, to: torch.dtype) -> Any:
    # as torch's autocast: floating-point tensors of the device, never fp64
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.device.type == _DEVICE:
        return value if value.dtype in (to, torch.float64) else value.to(to)
    return value
