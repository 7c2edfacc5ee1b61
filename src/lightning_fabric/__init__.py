"""Lightning Fabric with Intel Gaudi (HPU) support.

Everything upstream ``lightning.fabric`` offers is available here under the same names and as the same objects (every
submodule path too, ``lightning_fabric.utilities.seed`` included, as upstream's ``lightning-fabric`` wheel provides
them); the modules HPU support extends (accelerators, strategies, precision plugins) are our own. Fabric itself,
``lightning.Fabric`` as much as ``lightning_fabric.Fabric``, understands HPU flags whenever a Gaudi is present, whether
this package is imported or not (see :mod:`_lightning_hpu`).
"""

import virtual_hpu as _virtual_hpu

# before anything probes for Gaudi, so that ``VIRTUAL_HPU=1`` reaches every process, launched workers included
_virtual_hpu.activate_from_env()

import lightning.fabric as _upstream  # noqa: E402

import _lightning_hpu  # noqa: E402
from _lightning_hpu import aliasing as _aliasing  # noqa: E402

_aliasing.install()

from lightning.fabric import *  # noqa: E402, F403

# also when PyTorch's device-backend autoload, which does it otherwise, is turned off or no Gaudi is present (HPU
# flags then fail clearly)
_lightning_hpu.install()

_aliasing.extend_upstream(__name__, _upstream)
