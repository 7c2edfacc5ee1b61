"""Upstream's ``lightning.fabric.plugins.environments`` plus Open MPI's without mpi4py and Lightning's own with the
bridge's rendezvous set aside, which the Trainer uses too."""

import lightning.fabric.plugins.environments as _upstream

from _lightning_hpu import aliasing as _aliasing
from lightning_fabric.plugins.environments.hpu_lightning import HPULightningEnvironment
from lightning_fabric.plugins.environments.open_mpi import OpenMPIEnvironment

__all__ = ["HPULightningEnvironment", "OpenMPIEnvironment"]

_aliasing.extend_upstream(__name__, _upstream)
