"""Checkpoint I/O for Intel Gaudi: checkpoints hold CPU tensors, so they load anywhere."""

from typing import Any, Optional

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.fabric.utilities.types import _PATH
from typing_extensions import override


class HPUCheckpointIO(TorchCheckpointIO):
    """Saves checkpoints with every tensor moved to the CPU first, written atomically.

    The default of the HPU strategies. A checkpoint written by it loads on a machine without Gaudi as well as on HPUs
    (the strategy moves the weights back to its device). Pass another ``CheckpointIO`` in ``Trainer(plugins=...)`` to
    replace it.
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Optional[Any] = None) -> None:
        # upstream writes through a file-system transaction: a temporary file renamed into place once complete
        super().save_checkpoint(move_data_to_device(checkpoint, torch.device("cpu")), path, storage_options)
