"""Processes Lightning starts itself on a Gaudi, whose bridge writes where ranks meet when it loads."""

import os
from typing import Any, Optional

from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.plugins.environments.lightning import find_free_network_port
from typing_extensions import override

from lightning_fabric.plugins.environments.open_mpi import (
    BRIDGE_PORT,
    environment_given_or_detected,
    open_mpi_environment,
)


class HPULightningEnvironment(LightningEnvironment):
    """Upstream's environment for processes that ``Trainer`` and ``Fabric`` start themselves, with a free port where
    ``MASTER_PORT`` is the one Gaudi's bridge wrote.

    Since Gaudi software 1.21, ``import torch`` loads the bridge, which sets ``MASTER_ADDR=localhost`` and
    ``MASTER_PORT=12345`` where unset in any process torchrun did not start (``initialize_distributed_hpu``). Upstream
    takes a set ``MASTER_PORT`` for the user's choice, so every run on a node would meet on port 12345, and a second
    run there could not bind it. Here that port counts as unset: rank 0 takes a free port, as upstream does when none
    is set, and hands it to the ranks it starts. The HPU flags choose it for such runs on one node; a port set
    otherwise is used as upstream uses it.
    """

    def __init__(self) -> None:
        super().__init__()
        self._free_port: Optional[int] = None

    @property
    @override
    def main_port(self) -> int:
        if self._free_port is None:
            self._free_port = find_free_network_port()
        return self._free_port

    @staticmethod
    def bridge_wrote_the_rendezvous() -> bool:
        """Whether ``MASTER_PORT`` is the bridge's default in a process of one node that Lightning starts the others
        from (no ``LOCAL_RANK``, no ``NODE_RANK``/``GROUP_RANK``). The address does not matter: the bridge writes the
        port whenever it is unset, also beside an address the user exported. Nodes that Lightning starts processes on
        each keep the port, which is the same on every node."""
        launched = any(name in os.environ for name in ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK"))
        return os.environ.get("MASTER_PORT") == str(BRIDGE_PORT) and not launched


def hpu_cluster_environment(plugins: list[Any], strategy: Any) -> Optional[LightningEnvironment]:
    """The environment the HPU flags add to ``plugins``: Open MPI's for a run mpirun started
    (:func:`open_mpi_environment`), :class:`HPULightningEnvironment` where the bridge wrote the rendezvous and
    Lightning starts the processes; ``None`` (upstream's choice) otherwise."""
    environment = open_mpi_environment(plugins, strategy)
    if environment is not None:
        return environment
    if HPULightningEnvironment.bridge_wrote_the_rendezvous() and not environment_given_or_detected(plugins, strategy):
        return HPULightningEnvironment()
    return None
