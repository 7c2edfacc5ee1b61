"""Fully Sharded Data Parallel (FSDP) on Intel Gaudi: torch's ``FullyShardedDataParallel`` over HCCL."""

from typing import Any, Optional

from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.strategies.fsdp import FSDPStrategy
from typing_extensions import override

from lightning_fabric.strategies._hpu import _HPUParallelDevicesMixin, hccl_process_group
from lightning_fabric.strategies.hpu_fsdp import (
    put_hpu_mesh,
    refuse_device_id,
    refuse_replicas_without_shards,
    take_mesh_shape,
)
from pytorch_lightning.strategies._hpu import _HPUTrainerStrategyMixin


class HPUFSDPStrategy(_HPUTrainerStrategyMixin, _HPUParallelDevicesMixin, FSDPStrategy):
    """Upstream's ``FSDPStrategy`` on HPUs: one process per HPU over HCCL, parameters, gradients and optimizer state
    sharded across them.

    It takes every argument of :class:`~lightning.pytorch.strategies.FSDPStrategy` (``sharding_strategy``,
    ``auto_wrap_policy``, ``activation_checkpointing_policy``, ``cpu_offload``, ``mixed_precision``,
    ``state_dict_type``, ``device_mesh``, ``limit_all_gathers``, ``use_orig_params``, ...). By name it is
    ``strategy="hpu_fsdp"`` (and ``"hpu_fsdp_cpu_offload"``); with ``accelerator="hpu"`` upstream's ``"fsdp"`` and
    ``"fsdp_cpu_offload"`` mean the same. Its precision plugin is
    :class:`~pytorch_lightning.plugins.HPUFSDPPrecision`.
    """

    strategy_name = "hpu_fsdp"

    def __init__(self, *args: Any, process_group_backend: Optional[str] = "hccl", **kwargs: Any) -> None:
        refuse_device_id(type(self).__name__, kwargs)
        super().__init__(*args, process_group_backend=process_group_backend, **kwargs)
        refuse_replicas_without_shards(self.sharding_strategy.name, self.kwargs.get("device_mesh"))

    @override
    def setup_environment(self) -> None:
        self._require_hpu_accelerator("FSDPStrategy")
        mesh_shape = take_mesh_shape(self.kwargs)
        # upstream's set-up starts the process group itself, not through ``setup_distributed``
        with hccl_process_group():
            super().setup_environment()
        put_hpu_mesh(self.kwargs, mesh_shape, self.sharding_strategy.name, self.num_nodes, self.num_processes)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(cls.strategy_name, cls, description="FSDP on HPUs over HCCL")
        strategy_registry.register(
            f"{cls.strategy_name}_cpu_offload",
            cls,
            description="FSDP on HPUs over HCCL, parameters offloaded to host memory",
            cpu_offload=True,
        )
