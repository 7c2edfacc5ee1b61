"""Strategy for training on a single Intel Gaudi device."""

from typing import Optional

from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.strategies import _StrategyRegistry
from lightning.fabric.utilities.types import _DEVICE
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies.single_device import SingleDeviceStrategy
from typing_extensions import override

from lightning_fabric.strategies._hpu import single_hpu_device
from pytorch_lightning.strategies._hpu import _HPUTrainerStrategyMixin


class SingleHPUStrategy(_HPUTrainerStrategyMixin, SingleDeviceStrategy):
    """Trains on one HPU.

    ``Trainer(accelerator="hpu", devices=1)`` picks it; by name it is ``strategy="hpu_single"``.
    """

    strategy_name = "hpu_single"

    def __init__(
        self,
        device: _DEVICE = "hpu:0",
        accelerator: Optional[Accelerator] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[Precision] = None,
    ) -> None:
        device = single_hpu_device(device, type(self).__name__)
        super().__init__(
            device=device, accelerator=accelerator, checkpoint_io=checkpoint_io, precision_plugin=precision_plugin
        )

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(cls.strategy_name, cls, description="Training on a single HPU")
