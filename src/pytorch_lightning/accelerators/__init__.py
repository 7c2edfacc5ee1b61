"""Upstream's ``lightning.pytorch.accelerators`` plus the Intel Gaudi accelerator."""

import lightning.pytorch.accelerators as _upstream
from lightning.pytorch.accelerators import AcceleratorRegistry

from _lightning_hpu import aliasing as _aliasing
from pytorch_lightning.accelerators.hpu import HPUAccelerator

__all__ = ["HPUAccelerator"]

if HPUAccelerator.name() not in AcceleratorRegistry:
    HPUAccelerator.register_accelerators(AcceleratorRegistry)

_aliasing.extend_upstream(__name__, _upstream)
