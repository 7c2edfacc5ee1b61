"""Fully Sharded Data Parallel (FSDP) for Fabric on Intel Gaudi: torch's ``FullyShardedDataParallel`` over HCCL."""

from typing import Any, Optional

from lightning.fabric.strategies import FSDPStrategy, _StrategyRegistry
from typing_extensions import override

from pytorch_lightning.strategies._hpu import (
    _HPUParallelDevicesMixin,
    _HPUStrategyMixin,
    hccl_process_group,
)
from pytorch_lightning.strategies.hpu_fsdp import (
    put_hpu_mesh,
    refuse_device_id,
    refuse_replicas_without_shards,
    take_mesh_shape,
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
