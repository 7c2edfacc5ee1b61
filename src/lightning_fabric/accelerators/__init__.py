"""Upstream's ``lightning.fabric.accelerators`` plus the Intel Gaudi accelerator, the base of the Trainer's."""

import lightning.fabric.accelerators as _upstream
from lightning.fabric.accelerators import ACCELERATOR_REGISTRY

from _lightning_hpu import aliasing as _aliasing
from lightning_fabric.accelerators.hpu import HPUAccelerator

__all__ = ["HPUAccelerator"]

if HPUAccelerator.name() not in ACCELERATOR_REGISTRY:
    HPUAccelerator.register_accelerators(ACCELERATOR_REGISTRY)

_aliasing.extend_upstream(__name__, _upstream)
