"""Upstream's ``lightning.fabric.strategies`` plus the Intel Gaudi strategies for Fabric."""

import lightning.fabric.strategies as _upstream
from lightning.fabric.strategies import STRATEGY_REGISTRY

from _lightning_hpu import aliasing as _aliasing
from lightning_fabric.strategies.hpu_deepspeed import HPUDeepSpeedStrategy
from lightning_fabric.strategies.hpu_fsdp import HPUFSDPStrategy
from lightning_fabric.strategies.hpu_model_parallel import HPUModelParallelStrategy
from lightning_fabric.strategies.hpu_parallel import HPUDDPStrategy, HPUParallelStrategy
from lightning_fabric.strategies.single_hpu import SingleHPUStrategy

__all__ = [
    "HPUDDPStrategy",
    "HPUDeepSpeedStrategy",
    "HPUFSDPStrategy",
    "HPUModelParallelStrategy",
    "HPUParallelStrategy",
    "SingleHPUStrategy",
]

for _strategy in (SingleHPUStrategy, HPUParallelStrategy, HPUDeepSpeedStrategy, HPUFSDPStrategy):
    if _strategy.strategy_name not in STRATEGY_REGISTRY:
        _strategy.register_strategies(STRATEGY_REGISTRY)

_aliasing.extend_upstream(__name__, _upstream)
