"""Memory statistics of the virtual devices, with the keys and meaning of Gaudi's ``memory_stats``.

Memory is host memory counted per device. As on a Gaudi, the device allocator keeps freed blocks (of 64 KiB and more)
for reuse: ``memory_reserved`` counts what it holds from the host, in use or pooled, ``memory_allocated`` only what is
in use; ``TotalSystemAllocs`` counts the blocks it took from the host, ``NumAllocs`` every allocation.
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


def memory_reserved(device: Any = None) -> int:
    return torch.ops.virtual_hpu.memory_reserved(_index(device))[0]


def max_memory_reserved(device: Any = None) -> int:
    return torch.ops.virtual_hpu.memory_reserved(_index(device))[1]


memory_cached = memory_reserved
max_memory_cached = max_memory_reserved


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """``(free, total)`` bytes of the device."""
    stats = memory_stats(device)
    return stats["Limit"] - stats["InUse"], stats["Limit"]


def reset_accumulated_memory_stats(device: Any = None) -> None:
    raise NotImplementedError(
        "hpu.reset_accumulated_memory_stats (clearing NumAllocs and NumFrees) is not modelled on the virtual Gaudi;"
        " read memory_stats() before and after the code to measure instead."
    )


def memory_summary(device: Any = None) -> str:
    """The statistics of ``memory_stats``, one per line, bytes also in GiB."""
    index = _index(device)
    lines = [f"HPU memory summary, device {index}"]
    for key, value in memory_stats(index).items():
        size = "" if key.startswith(("Num", "Active", "Total")) else f" ({value / 2**30:.2f} GiB)"
        lines.append(f"  {key + ':':<20}{value:>16}{size}")
    return "\n".join(lines) + "\n"
