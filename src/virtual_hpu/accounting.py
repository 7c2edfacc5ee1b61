"""What a Gaudi run would see: graph cuts, ops per graph and device-to-host syncs in lazy mode; graph compilations
and graph breaks of ``torch.compile(backend="hpu_backend")`` in eager mode; collectives over HCCL and their bytes.

Counted in C++ with atomic counters, so reading them is cheap; ops are the aten ops that reach the device.
A host sync (``.item()``, ``.cpu()``, ``.tolist()``, printing, any copy from hpu to cpu) also ends the pending
graph in lazy mode, as it forces Gaudi to run it.
"""

import torch

from virtual_hpu import compilation
from virtual_hpu._config import refuse_as_hardware

COUNTER_NAMES = (
    "mark_steps",  # htcore.mark_step() calls in lazy mode
    "graphs",  # non-empty graphs ended by a mark_step or a host sync
    "ops",  # ops executed on the device in total
    "ops_since_cut",  # ops in the pending graph
    "last_graph_ops",  # ops in the most recently ended graph
    "max_graph_ops",  # ops in the largest graph
    "host_syncs",  # device-to-host reads
    "collectives",  # c10d collectives on hpu tensors (the virtual HCCL's), in this process
    "all_reduces",  # those of them that are all-reduces (DDP's gradient buckets, metric reductions)
    "collective_bytes",  # bytes of the tensors they sent
)


# compilations and graph breaks when this module was last reset: the bridge's metrics keep their own reset
_compile_base = (0, 0)


def counters() -> dict[str, int]:
    """The counters since activation or the last ``reset()``, plus ``graph_compilations`` and ``graph_breaks``."""
    refuse_as_hardware("virtual_hpu.accounting")
    counts = dict(zip(COUNTER_NAMES, torch.ops.virtual_hpu.counters()))
    counts["graph_compilations"] = compilation.compiled_ever() - _compile_base[0]
    counts["graph_breaks"] = compilation.graph_breaks_ever() - _compile_base[1]
    return counts


def reset() -> None:
    global _compile_base
    torch.ops.virtual_hpu.reset_counters()
    _compile_base = (compilation.compiled_ever(), compilation.graph_breaks_ever())
