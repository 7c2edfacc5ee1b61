"""Upstream's ``lightning.pytorch.cli`` whose ``LightningCLI`` builds our HPU-aware ``Trainer`` by default.

With it, ``--trainer.accelerator hpu``, ``--trainer.strategy hpu_parallel``, precision strings and class paths such as
``pytorch_lightning.plugins.HPUPrecisionPlugin`` work from the command line and from config files.
"""

from typing import Any

import lightning.pytorch.cli as _upstream
from lightning.pytorch.cli import LightningCLI as _UpstreamLightningCLI

from _lightning_hpu import aliasing as _aliasing
from pytorch_lightning.trainer import Trainer

__all__ = ["LightningCLI"]

# ``trainer_class`` is the fifth parameter of upstream's ``LightningCLI``
_TRAINER_CLASS_POSITION = 4


class LightningCLI(_UpstreamLightningCLI):
    """Upstream's ``LightningCLI``; ``trainer_class`` defaults to :class:`pytorch_lightning.Trainer`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) <= _TRAINER_CLASS_POSITION:
            kwargs.setdefault("trainer_class", Trainer)
        super().__init__(*args, **kwargs)


_aliasing.extend_upstream(__name__, _upstream)
