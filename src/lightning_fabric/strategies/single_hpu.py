"""Fabric strategy for one Intel Gaudi device."""

from typing import Optional

from lightning.fabric.accelerators import Accelerator
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.plugins.precision import Precision
from lightning.fabric.strategies import SingleDeviceStrategy, _StrategyRegistry
from lightning.fabric.utilities.types import _DEVICE
from typing_extensions import override

from lightning_fabric.strategies._hpu import _HPUStrategyMixin, single_hpu_device
from lightning_fabric.strategies.hpu_clip import _FusedClipNormMixin


class SingleHPUStrategy(_FusedClipNormMixin, _HPUStrategyMixin, SingleDeviceStrategy):
    """Fabric on one HPU.

    ``Fabric(accelerator="hpu", devices=1)`` picks it; by name it is ``strategy="hpu_single"``.
    ``fabric.clip_gradients(..., max_norm=...)`` uses Gaudi's fused clip-norm.
    """

    strategy_name = "hpu_single"

    def __init__(
        self,
        device: _DEVICE = "hpu:0",
        accelerator: Optional[Accelerator] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision: Optional[Precision] = None,
    ) -> None:
        device = single_hpu_device(device, type(self).__name__)
        super().__init__(device=device, accelerator=accelerator, checkpoint_io=checkpoint_io, precision=precision)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(cls.strategy_name, cls, description="Fabric on a single HPU")
