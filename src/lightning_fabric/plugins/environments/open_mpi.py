"""Processes started by Open MPI's ``mpirun``, read from the variables it gives each one, with or without mpi4py."""

import os
from typing import Any, Optional

from lightning.fabric.plugins.environments import (
    ClusterEnvironment,
    LSFEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from typing_extensions import override

# where Gaudi's bridge (``initialize_distributed_hpu``, which ``import torch`` runs since Gaudi software 1.21) has ranks
# meet when MASTER_ADDR/MASTER_PORT are not exported: it writes these into the environment
BRIDGE_ADDRESS, BRIDGE_PORT = "localhost", 12345


class OpenMPIEnvironment(ClusterEnvironment):
    """The processes of ``mpirun -np N python train.py``, as Gaudi clusters launch (Intel's mpirun lines, the MPI
    Operator on Kubernetes): ranks from ``OMPI_COMM_WORLD_{SIZE,RANK,LOCAL_RANK,LOCAL_SIZE}``, which Gaudi's bridge
    reads too, the rendezvous from the ``MASTER_ADDR``/``MASTER_PORT`` exported with ``-x`` (else the bridge's
    ``localhost:12345``). It needs no mpi4py, unlike upstream's ``MPIEnvironment``, and takes those variables as they
    are where upstream's asks MPI for host names.

    The HPU flags choose it for ``accelerator="hpu"`` when Open MPI started the process and no other cluster manager
    (torchrun, SLURM, LSF) nor a given environment is in charge; pass it in ``plugins`` to use it otherwise. Nodes are
    taken to hold consecutive ranks (``--map-by`` slot, ppr or socket, mpirun's default and Intel's lines), so a rank's
    node is ``rank // OMPI_COMM_WORLD_LOCAL_SIZE``.
    """

    @property
    @override
    def creates_processes_externally(self) -> bool:
        return True

    @property
    @override
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", BRIDGE_ADDRESS)

    @property
    @override
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", BRIDGE_PORT))

    @staticmethod
    @override
    def detect() -> bool:
        return "OMPI_COMM_WORLD_SIZE" in os.environ

    @override
    def world_size(self) -> int:
        return _read("OMPI_COMM_WORLD_SIZE")

    @override
    def set_world_size(self, size: int) -> None:
        pass  # mpirun's

    @override
    def global_rank(self) -> int:
        return _read("OMPI_COMM_WORLD_RANK")

    @override
    def set_global_rank(self, rank: int) -> None:
        pass  # mpirun's

    @override
    def local_rank(self) -> int:
        return _read("OMPI_COMM_WORLD_LOCAL_RANK")

    @override
    def node_rank(self) -> int:
        return self.global_rank() // self._processes_per_node()

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Fail on every process, before any rendezvous, when the run does not match what mpirun started: else a
        rank asks for a device or a node that is not there, and the others wait for it."""
        per_node, world_size = self._processes_per_node(), self.world_size()
        nodes = world_size // per_node
        if num_devices != per_node or num_nodes != nodes:
            raise ValueError(
                f"You set `devices={num_devices}` and `num_nodes={num_nodes}` in Lightning, but mpirun started"
                f" {world_size} processes, {per_node} per node (OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE), so"
                f" {nodes} node(s). HINT: Set `devices={per_node}, num_nodes={nodes}`, or start"
                f" `mpirun -np {num_devices * num_nodes}` on {num_nodes} host(s), {num_devices} process(es) on each."
            )
        # the bridge's default address, which it writes when it loads, is each node's own
        if nodes > 1 and os.environ.get("MASTER_ADDR", BRIDGE_ADDRESS) == BRIDGE_ADDRESS:
            raise ValueError(
                f"mpirun started processes on {nodes} nodes, and they need the address of the first to meet: export it"
                " to every process, e.g. `mpirun -x MASTER_ADDR=<node 0's address> -x MASTER_PORT=<a free port> ...`."
            )

    def _processes_per_node(self) -> int:
        return _read("OMPI_COMM_WORLD_LOCAL_SIZE", default=self.world_size())


def open_mpi_environment(plugins: list[Any], strategy: Any) -> Optional[OpenMPIEnvironment]:
    """An :class:`OpenMPIEnvironment` for an HPU run started by mpirun that no given environment, torchrun, SLURM or
    LSF manages; ``None`` otherwise."""
    if not OpenMPIEnvironment.detect() or environment_given_or_detected(plugins, strategy):
        return None
    return OpenMPIEnvironment()


def environment_given_or_detected(plugins: list[Any], strategy: Any) -> bool:
    """Whether ``plugins`` or ``strategy`` carry a cluster environment, or torchrun, SLURM or LSF started the
    process."""
    if any(isinstance(plugin, ClusterEnvironment) for plugin in plugins):
        return True
    if getattr(strategy, "cluster_environment", None) is not None:
        return True
    return any(environment.detect() for environment in (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment))


def _read(variable: str, default: Optional[int] = None) -> int:
    value = os.environ.get(variable)
    if value is None and default is not None:
        return default
    if value is None or not value.strip().isdigit():
        raise ValueError(
            f"`{variable}={value}` is not what mpirun sets: the process was not started by Open MPI's mpirun."
        )
    return int(value)
