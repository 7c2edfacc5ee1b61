"""Lightning Fabric on Intel Gaudi, for code that imports only ``lightning``.

``lightning.fabric.Fabric`` resolves its flags with upstream's ``lightning.fabric.connector._Connector``. It accepts an
accelerator from its registry, but ``accelerator="auto"``, the strategy names (``"ddp"``, ``"deepspeed"``) and the
precision flags are resolved for TPU, MPS, CUDA and CPU only, with no extension point for another device. Our
``Trainer`` subclass resolves HPU flags into the instances upstream accepts before upstream's connector sees them.
Fabric is used directly, so the same resolution comes in through its connector: Fabric builds
:class:`_lightning_hpu.connector.HPUConnector`, upstream's connector with the HPU flags resolved first
(:mod:`lightning_fabric.hpu_flags`).

How it gets there: this distribution registers :func:`autoload` in the ``torch.backends`` entry-point group, PyTorch's
device-backend autoload, which Intel's Gaudi bridge uses to load itself. PyTorch calls it at the end of
``import torch`` in every process (``python script.py``, the processes ``fabric.launch()`` and ``torchrun`` start, a
library that imports only ``lightning``, which imports torch first). When a Gaudi is present (Intel's
``habana_frameworks`` installed, or the virtual Gaudi asked for with ``VIRTUAL_HPU=1``), it has the name ``_Connector``
refer to ``HPUConnector`` in upstream's connector module as soon as that module has run, and in the Fabric module if
that has already bound it; without a Gaudi it returns at once and nothing changes. ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
turns it off with every other backend's autoload; importing ``lightning_fabric`` then does the same.

This rebinding of one upstream name is the only place the project changes what an upstream module refers to; a
contract test pins what it relies on (``tests/tests_pytorch/test_upstream_contracts.py``). This module imports only
the standard library: it runs inside ``import torch``, before ``lightning`` is imported.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Optional, Sequence

_CONNECTOR_MODULE = "lightning.fabric.connector"
_FABRIC_MODULE = "lightning.fabric.fabric"


def autoload() -> None:
    """When a Gaudi is present, have Fabric resolve HPU flags, and silence the known messages of dependencies that do
    not concern the user's run (:mod:`_lightning_hpu.console`) before any of them is imported; called by
    ``import torch``."""
    if not gaudi_present():
        return
    from _lightning_hpu import console

    console.quiet_known_noise()
    connector = sys.modules.get(_CONNECTOR_MODULE)
    if connector is not None and hasattr(connector, "_Connector"):
        _use_hpu_connector(connector)
    elif not any(isinstance(finder, _AfterConnectorImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterConnectorImport())


def gaudi_present() -> bool:
    """Whether Intel's Gaudi software is installed or the virtual Gaudi is asked for; imports nothing."""
    if os.environ.get("VIRTUAL_HPU", "").strip() == "1":
        return True
    return importlib.util.find_spec("habana_frameworks") is not None


def _use_hpu_connector(connector: ModuleType) -> None:
    from _lightning_hpu.connector import HPUConnector

    for module in (connector, sys.modules.get(_FABRIC_MODULE)):
        if module is not None and getattr(module, "_Connector", None) is HPUConnector.__base__:
            module._Connector = HPUConnector  # type: ignore[attr-defined]


class _AfterConnectorImport(importlib.abc.MetaPathFinder):
    """Finds upstream's connector module as the import system would, and has it use ``HPUConnector`` once it has
    run; then steps aside."""

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != _CONNECTOR_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenUseHPUConnector(spec.loader)
        return spec


class _ThenUseHPUConnector(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # the module keeps its own loader (source lookups, reloads)
        module.__loader__ = module.__spec__.loader = self._loader  # type: ignore[union-attr]
        self._loader.exec_module(module)
        _use_hpu_connector(module)
