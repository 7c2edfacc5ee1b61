"""Fabric strategy for data-parallel training over several Intel Gaudi devices and nodes."""

from typing import Any, Optional

from lightning.fabric.strategies import DDPStrategy, _StrategyRegistry
from typing_extensions import override

from lightning_fabric.strategies._hpu import (
    _HPUParallelDevicesMixin,
    _HPUStrategyMixin,
    hccl_ddp_names,
    hccl_process_group,
)
from lightning_fabric.strategies.hpu_clip import _FusedClipNormMixin
from lightning_fabric.strategies.hpu_ddp_options import _HCCLDDPOptionsMixin


class HPUParallelStrategy(
    _FusedClipNormMixin, _HCCLDDPOptionsMixin, _HPUStrategyMixin, _HPUParallelDevicesMixin, DDPStrategy
):
    """DistributedDataParallel over HCCL for Fabric, one process per HPU.

    ``Fabric(accelerator="hpu", devices=N)`` with ``N > 1`` picks it, and so do upstream's ``"ddp"`` and
    ``"ddp_spawn"`` with an HPU; by name it is ``strategy="hpu_parallel"`` (processes started by
    ``fabric.launch()`` as subprocesses of the script, or by ``torchrun``), ``"hpu_parallel_spawn"`` or
    ``"hpu_ddp"``. DDP's options (``find_unused_parameters``, ``static_graph``, ...) pass through as for
    ``DDPStrategy``; those not given are Intel's for HCCL (``bucket_cap_mb=230``, ``gradient_as_bucket_view=True``).
    ``fabric.clip_gradients(..., max_norm=...)`` uses Gaudi's fused clip-norm.
    """

    strategy_name = "hpu_parallel"

    def __init__(self, *args: Any, process_group_backend: Optional[str] = "hccl", **kwargs: Any) -> None:
        super().__init__(*args, process_group_backend=process_group_backend, **kwargs)

    @override
    def _setup_distributed(self) -> None:
        with hccl_process_group():
            super()._setup_distributed()

    @override
    def _determine_ddp_device_ids(self) -> None:
        # each process drives exactly one HPU, which the module already lives on
        return None

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        for name, start_method in hccl_ddp_names(cls.strategy_name):
            strategy_registry.register(
                name,
                cls,
                description=f"Fabric DDP over HCCL on HPUs, processes started with '{start_method}'",
                start_method=start_method,
            )


# lightning-habana's name for the class
HPUDDPStrategy = HPUParallelStrategy
