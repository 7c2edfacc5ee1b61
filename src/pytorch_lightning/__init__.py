"""PyTorch Lightning with Intel Gaudi (HPU) support built into the Trainer.

Everything upstream ``lightning.pytorch`` offers is available here under the same names and as the same objects;
``Trainer`` and the modules that HPU support extends are our own.
"""

import virtual_hpu as _virtual_hpu
from _lightning_hpu import console as _console

# also when PyTorch's device-backend autoload, which does it first, is turned off
_console.quiet_known_noise()
# before anything probes for Gaudi, so that ``VIRTUAL_HPU=1`` reaches every process, launched workers included
_virtual_hpu.activate_from_env()

import lightning.pytorch as _upstream  # noqa: E402

from _lightning_hpu import aliasing as _aliasing  # noqa: E402
from pytorch_lightning.__about__ import __version__  # noqa: E402, F401

_aliasing.install()

from lightning.pytorch import *  # noqa: E402, F403

from pytorch_lightning.trainer import Trainer  # noqa: E402

__all__ = ["Trainer"]

_aliasing.extend_upstream(__name__, _upstream)
