"""Accelerator for Intel Gaudi devices (HPUs) in the Trainer."""

from typing import Any

from lightning.fabric.utilities.types import _DEVICE
from lightning.pytorch.accelerators.accelerator import Accelerator
from typing_extensions import override

from lightning_fabric.accelerators.hpu import HPUAccelerator as FabricHPUAccelerator


class HPUAccelerator(Accelerator, FabricHPUAccelerator):
    """Accelerator for Intel Gaudi devices (HPUs), real or virtual: Fabric's, with the device statistics the Trainer
    logs (``DeviceStatsMonitor``).

    Select it with ``Trainer(accelerator="hpu")``; ``accelerator="auto"`` picks it whenever a Gaudi is present.
    """

    @override
    def get_device_stats(self, device: _DEVICE) -> dict[str, Any]:
        """The Gaudi memory statistics of ``device`` (``Limit``, ``InUse``, ``MaxInUse``, ``NumAllocs``, ...)."""
        import habana_frameworks.torch.hpu as hthpu

        return dict(hthpu.memory_stats(device))
