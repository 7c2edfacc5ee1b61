"""Upstream's ``lightning.pytorch.plugins.environments`` plus Open MPI's without mpi4py and Lightning's own with the
bridge's rendezvous set aside (Fabric's, as upstream's environments serve both)."""

import lightning.pytorch.plugins.environments as _upstream

from _lightning_hpu import aliasing as _aliasing
from lightning_fabric.plugins.environments import HPULightningEnvironment, OpenMPIEnvironment

__all__ = ["HPULightningEnvironment", "OpenMPIEnvironment"]

_aliasing.extend_upstream(__name__, _upstream)
