"""Upstream's peak-FLOPs lookup, knowing Gaudi: what ``device/mfu`` of Lightning's throughput tools divides by."""

import functools
import importlib
from typing import Any, Optional

import torch

# upstream's function, whatever its module's name refers to by now; loaded while `lightning` itself is still being
# imported, so the module is taken from the import system rather than from its package
_upstream = importlib.import_module("lightning.fabric.utilities.throughput").get_available_flops
_upstream = getattr(_upstream, "__wrapped__", _upstream)


@functools.wraps(_upstream)
def get_available_flops(device: torch.device, dtype: Any) -> Optional[int]:
    """Upstream's ``get_available_flops``, with the peak of the Gaudi generation present for an ``hpu`` device
    (:func:`lightning_fabric.accelerators.hpu_flops.peak_flops`); other devices get upstream's answer."""
    if device.type != "hpu":
        return _upstream(device, dtype)
    from lightning_fabric.accelerators.hpu_flops import peak_flops

    return peak_flops(dtype)
