"""Fully Sharded Data Parallel (FSDP) for Fabric on Intel Gaudi: torch's ``FullyShardedDataParallel`` over HCCL."""

from typing import Any, Optional

from lightning.fabric.strategies import FSDPStrategy, _StrategyRegistry
from typing_extensions import override

from lightning_fabric.strategies._hpu import (
    _HPUParallelDevicesMixin,
    _HPUStrategyMixin,
    hccl_process_group,
)


class HPUFSDPStrategy(_HPUStrategyMixin, _HPUParallelDevicesMixin, FSDPStrategy):
    """Upstream's Fabric ``FSDPStrategy`` on HPUs: one process per HPU over HCCL, parameters, gradients and optimizer
    state sharded across them.

    It takes every argument of :class:`~lightning.fabric.strategies.FSDPStrategy` (``sharding_strategy``,
    ``auto_wrap_policy``, ``activation_checkpointing_policy``, ``cpu_offload``, ``state_dict_type``, ``device_mesh``,
    ...). By name it is ``strategy="hpu_fsdp"`` (and ``"hpu_fsdp_cpu_offload"``); with an HPU, upstream's ``"fsdp"``,
    ``"fsdp_cpu_offload"`` and ``FSDPStrategy(...)`` mean the same. Its precision plugin is
    :class:`~lightning_fabric.plugins.HPUFSDPPrecision`.
    """

    strategy_name = "hpu_fsdp"

    def __init__(self, *args: Any, process_group_backend: Optional[str] = "hccl", **kwargs: Any) -> None:
        refuse_device_id(type(self).__name__, kwargs)
        super().__init__(*args, process_group_backend=process_group_backend, **kwargs)
        refuse_replicas_without_shards(self.sharding_strategy.name, self._fsdp_kwargs.get("device_mesh"))

    @override
    def setup_environment(self) -> None:
        self._require_hpu_accelerator("FSDPStrategy")
        mesh_shape = take_mesh_shape(self._fsdp_kwargs)
        super().setup_environment()
        put_hpu_mesh(self._fsdp_kwargs, mesh_shape, self.sharding_strategy.name, self.num_nodes, self.num_processes)

    @override
    def _setup_distributed(self) -> None:
        with hccl_process_group():
            super()._setup_distributed()

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(cls.strategy_name, cls, description="Fabric FSDP on HPUs over HCCL")
        strategy_registry.register(
            f"{cls.strategy_name}_cpu_offload",
            cls,
            description="Fabric FSDP on HPUs over HCCL, parameters offloaded to host memory",
            cpu_offload=True,
        )


def take_mesh_shape(fsdp_kwargs: dict[str, Any]) -> Optional[tuple[int, ...]]:
    """A ``device_mesh`` given as a shape, taken out of FSDP's arguments before upstream's set-up, which builds it on
    CUDA; :func:`put_hpu_mesh` builds it on HPUs once the processes have met."""
    return fsdp_kwargs.pop("device_mesh") if isinstance(fsdp_kwargs.get("device_mesh"), tuple) else None


def put_hpu_mesh(
    fsdp_kwargs: dict[str, Any],
    mesh_shape: Optional[tuple[int, ...]],
    sharding_strategy: str,
    num_nodes: int,
    devices_per_node: int,
) -> None:
    """The HPU mesh FSDP runs over: the shape given, or by default one dimension over every rank, and for hybrid
    sharding (nodes, devices per node): shards within a node, replicas across nodes.

    With a mesh FSDP's sharded state dicts hold DTensors; without one, torch's ShardedTensor, which asks CUDA for its
    device on a rank that holds none of a tensor (any backend but gloo). Without a mesh, hybrid sharding would size its
    groups by the HPUs of the node, not those of the run, and fail with fewer (``devices=2`` on an 8-card node).
    Explicit process groups are kept.
    """
    if mesh_shape is None and "device_mesh" not in fsdp_kwargs and fsdp_kwargs.get("process_group") is None:
        hybrid = "HYBRID" in sharding_strategy
        mesh_shape = (num_nodes, devices_per_node) if hybrid else (num_nodes * devices_per_node,)
        refuse_replicas_without_shards(sharding_strategy, mesh_shape)
    if mesh_shape is not None:
        from torch.distributed.device_mesh import init_device_mesh

        fsdp_kwargs["device_mesh"] = init_device_mesh("hpu", mesh_shape)


def refuse_device_id(owner: str, fsdp_kwargs: dict[str, Any]) -> None:
    """FSDP's ``device_id`` is each process's own HPU, which the strategy gives it."""
    if "device_id" in fsdp_kwargs:
        raise ValueError(
            f"`{owner}(device_id={fsdp_kwargs['device_id']!r})`: the strategy gives FSDP each process's own HPU"
            " as its device. Remove `device_id`; choose the HPUs with `devices=...`."
        )


def refuse_replicas_without_shards(sharding_strategy: str, mesh: Any) -> None:
    """Torch runs ``HYBRID_SHARD`` over a mesh ``(N, 1)`` as ``NO_SHARD`` within one-rank groups, which never reduces
    gradients across the N replicas: each rank would train alone."""
    shape = tuple(mesh) if isinstance(mesh, tuple) else tuple(getattr(mesh, "shape", ()))
    if "HYBRID" in sharding_strategy and len(shape) == 2 and shape[0] > 1 and shape[1] == 1:
        raise ValueError(
            f"`HPUFSDPStrategy(sharding_strategy={sharding_strategy!r}, device_mesh={shape})` would replicate the model"
            f" {shape[0]} times without ever reducing across the replicas (one rank per shard group). Give the mesh as"
            " (replicas, ranks per replica) with more than one rank per replica, e.g. (nodes, devices per node)."
        )
