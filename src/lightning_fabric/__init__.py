"""``lightning_fabric`` as an alias of ``lightning.fabric``.

Upstream's ``pytorch-lightning`` wheel ships this package, so installing ours in its place must keep
``import lightning_fabric`` (and every submodule path below it) working, with upstream's module objects.
"""

import sys

import lightning.fabric

from pytorch_lightning import _aliasing

_aliasing.install()
sys.modules[__name__] = lightning.fabric
