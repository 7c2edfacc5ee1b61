"""Memory statistics of the virtual devices, with the keys and meaning of Gaudi's ``memory_stats``.

Memory is host memory counted per device; there is no caching pool, so "reserved" equals "allocated".
"""

from typing import Any

import torch

MEMORY_STATS_KEYS = (
    "Limit",
    "InUse",
    "MaxInUse",
    "NumAllocs",
    "NumFrees",
    "ActiveAllocs",
    "MaxAllocSize",
    "TotalSystemAllocs",
    "TotalSystemFrees",
    "TotalActiveAllocs",
)


def _index(device: Any) -> int:
    from habana_frameworks.torch.hpu import _index

    return _index(device)


def memory_stats(device: Any = None) -> dict[str, int]:
    return dict(zip(MEMORY_STATS_KEYS, torch.ops.virtual_hpu.memory_stats(_index(device))))


def memory_allocated(device: Any = None) -> int:
    return memory_stats(device)["InUse"]


def max_memory_allocated(device: Any = None) -> int:
    return memory_stats(device)["MaxInUse"]


def reset_peak_memory_stats(device: Any = None) -> None:
    torch.ops.virtual_hpu.reset_peak_memory_stats(_index(device))


def reset_max_memory_allocated(device: Any = None) -> None:
    reset_peak_memory_stats(device)


memory_reserved = memory_cached = memory_allocated
max_memory_reserved = max_memory_cached = max_memory_allocated


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """``(free, total)`` bytes of the device."""
    stats = memory_stats(device)
    return stats["Limit"] - stats["InUse"], stats["Limit"]
