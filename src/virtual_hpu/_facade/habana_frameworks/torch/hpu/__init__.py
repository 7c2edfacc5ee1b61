"""``habana_frameworks.torch.hpu``, also registered as ``torch.hpu``: devices, memory, streams, random numbers, and
the autocast state of ``hpu``."""

import contextlib
import os
import warnings
from collections.abc import Iterator
from typing import Any, Union

import torch

from habana_frameworks.torch.hpu import random
from habana_frameworks.torch.hpu.graphs import (
    HPUGraph,
    ModuleCacher,
    graph,
    make_graphed_callables,
    wrap_in_hpu_graph,
    wrap_in_hpu_graph_func,
)
from habana_frameworks.torch.hpu.memory import (
    max_memory_allocated,
    max_memory_cached,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_cached,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
)
from habana_frameworks.torch.hpu.metrics import metric_global, metric_localcontext
from habana_frameworks.torch.hpu.random import (
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_ctx,
    set_rng_state,
    set_rng_state_all,
    unset_rng_ctx,
)
from habana_frameworks.torch.hpu.streams import (
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    get_stream_info,
    is_lazy_mode,
    record_stream,
    set_stream,
    stream,
)

_DeviceLike = Union[torch.device, str, int, None]

# the environment variables naming the cards a process may use and the one it uses, on a Gaudi
HABANA_VISIBLE_MODULES_VAR = "HABANA_VISIBLE_MODULES"
HLS_MODULE_ID_VAR = "HLS_MODULE_ID"

__all__ = [
    "Event",
    "HPUGraph",
    "ModuleCacher",
    "Stream",
    "current_device",
    "can_device_access_peer",
    "current_stream",
    "default_generators",
    "default_stream",
    "device",
    "device_count",
    "device_of",
    "enable_recompute_sdp",
    "get_arch_list",
    "get_device_capability",
    "get_device_properties",
    "get_rng_state_all",
    "get_sync_debug_mode",
    "memory_summary",
    "memory_usage",
    "metric_global",
    "metric_localcontext",
    "reset_accumulated_memory_stats",
    "StreamContext",
    "get_stream_info",
    "is_lazy",
    "is_lazy_mode",
    "record_stream",
    "BFloat16Tensor",
    "BoolTensor",
    "ByteTensor",
    "CharTensor",
    "DoubleTensor",
    "FloatTensor",
    "HalfTensor",
    "IntTensor",
    "LongTensor",
    "ShortTensor",
    "HABANA_VISIBLE_MODULES_VAR",
    "HLS_MODULE_ID_VAR",
    "disable_dynamic_shape",
    "enable_dynamic_shape",
    "get_dynamic_shape_status",
    "getDeterministic",
    "setDeterministic",
    "get_gencode_flags",
    "utilization",
    "recompute_sdp_enabled",
    "sdp_kernel",
    "set_rng_ctx",
    "set_rng_state_all",
    "set_stream",
    "set_sync_debug_mode",
    "unset_rng_ctx",
    "get_autocast_hpu_dtype",
    "get_device_name",
    "get_rng_state",
    "graph",
    "init",
    "initial_seed",
    "is_autocast_hpu_enabled",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "make_graphed_callables",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_cached",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_cached",
    "memory_reserved",
    "memory_stats",
    "random",
    "reset_max_memory_allocated",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_autocast_hpu_dtype",
    "set_autocast_hpu_enabled",
    "set_device",
    "set_rng_state",
    "stream",
    "synchronize",
    "wrap_in_hpu_graph",
    "wrap_in_hpu_graph_func",
]


def _lazy_init() -> None:
    """Called by torch before first use of the device module; the device is ready at activation."""


def init() -> None:
    _lazy_init()


def is_initialized() -> bool:
    return True


def is_available() -> bool:
    return device_count() > 0


def device_count() -> int:
    return torch.ops.virtual_hpu.device_count()


def current_device() -> int:
    return torch.ops.virtual_hpu.current_device()


def set_device(device: _DeviceLike) -> None:
    torch.ops.virtual_hpu.set_device(_index(device))


def get_device_name(device: _DeviceLike = None) -> str:
    """``"GAUDI"``, ``"GAUDI2"`` or ``"GAUDI3"``, after ``VIRTUAL_HPU_GENERATION``."""
    import virtual_hpu

    return virtual_hpu.config().generation


def synchronize() -> None:
    """Work on the virtual device completes before each op returns: nothing to wait for."""


def is_bf16_supported() -> bool:
    """Every Gaudi generation computes in bf16."""
    return is_available()


# The bridge's names for torch's autocast state of the ``hpu`` device, read by code written for Gaudi.
def is_autocast_hpu_enabled() -> bool:
    return torch.is_autocast_enabled("hpu")


def set_autocast_hpu_enabled(enabled: bool) -> None:
    torch.set_autocast_enabled("hpu", bool(enabled))


def get_autocast_hpu_dtype() -> torch.dtype:
    return torch.get_autocast_dtype("hpu")


def set_autocast_hpu_dtype(dtype: torch.dtype) -> None:
    torch.set_autocast_dtype("hpu", dtype)


# torch asks these of the device module of its PrivateUse1 backend, which hpu is on a torch built for another
# accelerator (virtual_hpu.is_privateuse1()).
def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes ``torch.autocast("hpu")`` accepts; float16 on first-generation Gaudi is refused when an op casts,
    as on the HPU device type."""
    return [torch.bfloat16, torch.float16]


def _is_in_bad_fork() -> bool:
    """The virtual device has no driver state that a forked child could lose."""
    return False


def _index(device: _DeviceLike) -> int:
    """Index of ``device`` (``hpu``, ``hpu:1``, ``1``, ``None``), the current device when it has none."""
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "hpu":
        raise ValueError(f"Expected an hpu device, got {device}")
    return current_device() if device.index is None else device.index


class device:
    """Context manager that makes ``device`` the current device, restoring the previous one on exit."""

    def __init__(self, device: Any) -> None:
        self.index = -1 if device is None else _index(device)
        self.previous = -1

    def __enter__(self) -> None:
        self.previous = current_device()
        if self.index >= 0:
            set_device(self.index)

    def __exit__(self, *exc: object) -> None:
        set_device(self.previous)


class device_of(device):
    """Context manager that makes the device of ``obj`` (a tensor) current; no change for a tensor not on hpu."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.device if obj.device.type == "hpu" else None)


def get_device_capability(device: _DeviceLike = None) -> str:
    """The device's generation, which is what capability means on a Gaudi."""
    _check_index(device)
    return get_device_name(device)


def get_device_properties(device: _DeviceLike = None) -> str:
    """A description of the device (name, memory, count), as the bridge gives it: a string."""
    index = _check_index(device)
    limit = memory_stats(index)["Limit"]
    return f"(name={get_device_name(index)}, virtual=True, total_memory={limit // 2**20}MB, count={device_count()})"


def can_device_access_peer(device: _DeviceLike, peer_device: _DeviceLike) -> bool:
    first, second = _check_index(device), _check_index(peer_device)
    if first == second:
        raise ValueError(f"can_device_access_peer takes two different devices, got hpu:{first} twice.")
    return True


def get_arch_list() -> list[str]:
    return [get_device_name()]


def memory_usage(device: _DeviceLike = None) -> int:
    """Bytes in use on the device (``hl-smi``'s figure on a Gaudi)."""
    return memory_stats(_check_index(device))["InUse"]


def set_sync_debug_mode(debug_mode: Any) -> None:
    """Whether streams run asynchronously (``PT_ENABLE_HABANA_STREAMASYNC``); every op is synchronous here."""
    os.environ["PT_ENABLE_HABANA_STREAMASYNC"] = str(debug_mode)


def get_sync_debug_mode() -> int:
    return int(os.environ["PT_ENABLE_HABANA_STREAMASYNC"])


class _FusedAttentionSettings:
    """Whether ``FusedSDPA`` recomputes in its backward by default (``recompute_mode=None``)."""

    recompute = False


def enable_recompute_sdp(enabled: bool) -> None:
    _FusedAttentionSettings.recompute = bool(enabled)


def recompute_sdp_enabled() -> bool:
    return _FusedAttentionSettings.recompute


@contextlib.contextmanager
def sdp_kernel(enable_recompute: bool = True) -> Iterator[dict]:
    """Within the block, ``FusedSDPA`` recomputes in its backward (or not); the previous setting after it."""
    previous = recompute_sdp_enabled()
    enable_recompute_sdp(enable_recompute)
    try:
        yield {}
    finally:
        enable_recompute_sdp(previous)


def _check_index(device: _DeviceLike) -> int:
    index = _index(device)
    if not 0 <= index < device_count():
        raise ValueError(f"hpu:{index} does not exist: there are {device_count()} devices.")
    return index


def is_lazy() -> bool:
    """Whether lazy mode is on (``PT_HPU_LAZY_MODE``), as read at activation."""
    from habana_frameworks.torch.core import is_lazy

    return is_lazy()


def utilization(device: _DeviceLike = None) -> int:
    raise NotImplementedError(
        "hpu.utilization reads the card's utilization from hl-smi (pyhlml), which the virtual Gaudi does not model;"
        " call it on a Gaudi."
    )


def get_gencode_flags() -> str:
    return ""


def setDeterministic(val: bool) -> None:
    """Deprecated in the bridge for ``torch.use_deterministic_algorithms``, which it calls."""
    warnings.warn(
        "torch.hpu.setDeterministic is deprecated: use torch.use_deterministic_algorithms", FutureWarning, stacklevel=2
    )
    torch.use_deterministic_algorithms(bool(val))


def getDeterministic() -> bool:
    warnings.warn(
        "torch.hpu.getDeterministic is deprecated: use torch.are_deterministic_algorithms_enabled",
        FutureWarning,
        stacklevel=2,
    )
    return torch.are_deterministic_algorithms_enabled()


class _DynamicShapes:
    """Whether graphs are compiled for ranges of shapes (on a Gaudi); every shape runs on the virtual Gaudi."""

    enabled = True


def enable_dynamic_shape() -> None:
    _DynamicShapes.enabled = True


def disable_dynamic_shape() -> None:
    _DynamicShapes.enabled = False


def get_dynamic_shape_status() -> bool:
    return _DynamicShapes.enabled


class _TensorType(torch.Tensor):
    """``torch.hpu.FloatTensor([...])`` and the other legacy typed constructors: a copy of the data on ``hpu``."""

    dtype_of_type: torch.dtype

    def __new__(cls, *args: Any, **kwargs: Any) -> torch.Tensor:
        for key, expected in (("device", "hpu"), ("dtype", cls.dtype_of_type)):
            given = kwargs.pop(key, None)
            if given is not None and given != expected:
                raise RuntimeError(f"{cls.__name__} makes {expected} tensors, got {key}={given!r}.")
        data = torch.tensor(*args, dtype=cls.dtype_of_type, device="hpu", **kwargs)
        return torch.Tensor._make_subclass(cls, data)


def _tensor_type(name: str, dtype: torch.dtype) -> type:
    return type(name, (_TensorType,), {"dtype_of_type": dtype, "__module__": __name__})


BFloat16Tensor = _tensor_type("BFloat16Tensor", torch.bfloat16)
BoolTensor = _tensor_type("BoolTensor", torch.bool)
ByteTensor = _tensor_type("ByteTensor", torch.uint8)
CharTensor = _tensor_type("CharTensor", torch.int8)
DoubleTensor = _tensor_type("DoubleTensor", torch.float64)
FloatTensor = _tensor_type("FloatTensor", torch.float32)
HalfTensor = _tensor_type("HalfTensor", torch.float16)
IntTensor = _tensor_type("IntTensor", torch.int32)
LongTensor = _tensor_type("LongTensor", torch.int64)
ShortTensor = _tensor_type("ShortTensor", torch.int16)
