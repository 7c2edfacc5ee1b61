"""Upstream's ``lightning.pytorch.strategies`` plus the Intel Gaudi strategies."""

import lightning.pytorch.strategies as _upstream
from lightning.pytorch.strategies import StrategyRegistry

from _lightning_hpu import aliasing as _aliasing
from pytorch_lightning.strategies.hpu_deepspeed import HPUDeepSpeedStrategy
from pytorch_lightning.strategies.hpu_fsdp import HPUFSDPStrategy
from pytorch_lightning.strategies.hpu_model_parallel import HPUModelParallelStrategy
from pytorch_lightning.strategies.hpu_parallel import HPUDDPStrategy, HPUParallelStrategy
from pytorch_lightning.strategies.single_hpu import SingleHPUStrategy

__all__ = [
    "HPUDDPStrategy",
    "HPUDeepSpeedStrategy",
    "HPUFSDPStrategy",
    "HPUModelParallelStrategy",
    "HPUParallelStrategy",
    "SingleHPUStrategy",
]

_HPU_STRATEGIES = (
    SingleHPUStrategy,
    HPUParallelStrategy,
    HPUDeepSpeedStrategy,
    HPUFSDPStrategy,
    HPUModelParallelStrategy,
)
for _strategy in _HPU_STRATEGIES:
    if _strategy.strategy_name not in StrategyRegistry:
        _strategy.register_strategies(StrategyRegistry)

_aliasing.extend_upstream(__name__, _upstream)
