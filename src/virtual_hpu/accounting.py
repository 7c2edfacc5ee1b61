"""What a lazy-mode Gaudi run would see: graph cuts, ops per graph and device-to-host syncs.

Counted in C++ with atomic counters, so reading them is cheap; ops are the aten ops that reach the device.
A host sync (``.item()``, ``.cpu()``, ``.tolist()``, printing, any copy from hpu to cpu) also ends the pending
graph in lazy mode, as it forces Gaudi to run it.
"""

import torch

COUNTER_NAMES = (
    "mark_steps",  # htcore.mark_step() calls in lazy mode
    "graphs",  # non-empty graphs ended by a mark_step or a host sync
    "ops",  # ops executed on the device in total
    "ops_since_cut",  # ops in the pending graph
    "last_graph_ops",  # ops in the most recently ended graph
    "max_graph_ops",  # ops in the largest graph
    "host_syncs",  # device-to-host reads
)


def counters() -> dict[str, int]:
    """The counters since activation or the last ``reset()``."""
    return dict(zip(COUNTER_NAMES, torch.ops.virtual_hpu.counters()))


def reset() -> None:
    torch.ops.virtual_hpu.reset_counters()
