"""Lightning's ``Trainer`` and ``Fabric`` on Intel Gaudi, for code that imports only ``lightning``.

Upstream's ``lightning.Trainer`` and ``lightning.Fabric`` resolve their flags with a connector each
(``lightning.pytorch.trainer.connectors.accelerator_connector._AcceleratorConnector`` and
``lightning.fabric.connector._Connector``). They accept an accelerator from their registries, but
``accelerator="auto"``, the strategy names (``"ddp"``, ``"deepspeed"``) and the precision flags are resolved for TPU,
MPS, CUDA and CPU only, with no extension point for another device. Each has an HPU subclass that resolves the HPU flags
into the instances upstream accepts, then lets upstream's connector run:
:class:`_lightning_hpu.accelerator_connector.HPUAcceleratorConnector` (:mod:`pytorch_lightning.trainer.hpu_flags`) and
:class:`_lightning_hpu.connector.HPUConnector` (:mod:`lightning_fabric.hpu_flags`), each giving its classes to the one
resolver, :class:`_lightning_hpu.flags.HPUFlags`. Our ``pytorch_lightning.Trainer`` is upstream's Trainer, so it
resolves its flags through the same connector. The Trainer's callback connector
(``lightning.pytorch.trainer.connectors.callback_connector._CallbackConnector``) has an HPU subclass too,
:class:`_lightning_hpu.callback_connector.HPUCallbackConnector`: upstream logs a line for its own devices only and picks
its default progress bar for them, so through it every Trainer on HPUs logs the HPU line and gets the HPU progress bar.
One function gets the same treatment: upstream's table of peak FLOPs
(``lightning.fabric.utilities.throughput.get_available_flops``) knows CUDA and XLA only, so its throughput tools' name
for it refers to :func:`_lightning_hpu.throughput.get_available_flops`, which knows Gaudi and asks upstream's for other
devices.

How they get there: this distribution registers :func:`autoload` in the ``torch.backends`` entry-point group, PyTorch's
device-backend autoload, which Intel's Gaudi bridge uses to load itself. PyTorch calls it at the end of
``import torch`` in every process (``python script.py``, the processes Lightning's launchers, ``fabric run`` and
``torchrun`` start, a library that imports only ``lightning``, which imports torch first). When a Gaudi is present
(Intel's ``habana_frameworks`` installed, or the virtual Gaudi asked for with ``VIRTUAL_HPU=1``), it has each
connector's name refer to its HPU subclass in upstream's connector module as soon as that module has run, and in the
module that builds the connector (the Trainer's, Fabric's) if that has already bound it; without a Gaudi it returns at
once and nothing changes. ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns it off with every other backend's autoload;
importing ``pytorch_lightning`` or ``lightning_fabric`` then does the same (:func:`install`).

These rebindings head the product's table of the names of torch and upstream it changes
(:mod:`_lightning_hpu.foreign_names`: target, replacement, when, why, off switch; the virtual Gaudi keeps its own,
:mod:`virtual_hpu.foreign_names`). A contract test (``tests/tests_pytorch/test_upstream_contracts.py``) pins what they
rely on, and fails when code changes a name of torch or upstream that no table lists. This module imports only the
standard library: it runs inside ``import torch``, before ``lightning`` is imported.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import NamedTuple, Optional, Sequence


class _Rebinding(NamedTuple):
    """Upstream's ``name`` in ``module`` (a connector, or a function), used by ``user``, our counterpart ``hpu``
    (``module:attribute``: a subclass, or a function that wraps upstream's), and ``why`` upstream's will not do."""

    module: str
    name: str
    user: str
    hpu: str
    why: str


_FLAGS = (
    "upstream resolves `accelerator='auto'`, strategy names and precision flags for CUDA, MPS, TPU and the CPU only,"
    " with no extension point for another device"
)


_REBINDINGS = (
    _Rebinding(
        "lightning.fabric.connector",
        "_Connector",
        "lightning.fabric.fabric",
        "_lightning_hpu.connector:HPUConnector",
        _FLAGS,
    ),
    _Rebinding(
        "lightning.pytorch.trainer.connectors.accelerator_connector",
        "_AcceleratorConnector",
        "lightning.pytorch.trainer.trainer",
        "_lightning_hpu.accelerator_connector:HPUAcceleratorConnector",
        _FLAGS,
    ),
    _Rebinding(
        "lightning.pytorch.trainer.connectors.callback_connector",
        "_CallbackConnector",
        "lightning.pytorch.trainer.trainer",
        "_lightning_hpu.callback_connector:HPUCallbackConnector",
        "upstream logs a line for its own devices only and picks its default progress bar for them: without it"
        " `lightning.Trainer` would not say it uses HPUs, and its bar would wait for the HPU after every step",
    ),
    _Rebinding(
        "lightning.fabric.utilities.throughput",
        "get_available_flops",
        "lightning.pytorch.callbacks.throughput_monitor",
        "_lightning_hpu.throughput:get_available_flops",
        "upstream's table of peak FLOPs knows CUDA and XLA devices only, so its throughput tools (the Trainer's"
        " `ThroughputMonitor`, Fabric's) log no `device/mfu` on HPUs; nothing lets a device add its figures",
    ),
)


def autoload() -> None:
    """When a Gaudi is present, :func:`install`; called by ``import torch``."""
    if gaudi_present():
        install()


def install() -> None:
    """Have the Trainer and Fabric resolve HPU flags, and silence the known messages of dependencies that do not
    concern the user's run (:mod:`_lightning_hpu.console`) before any of them is imported."""
    from _lightning_hpu import console

    console.quiet_known_noise()
    pending = []
    for rebinding in _REBINDINGS:
        module = sys.modules.get(rebinding.module)
        if module is not None and hasattr(module, rebinding.name):
            _use_hpu_connector(rebinding, module)
        else:
            pending.append(rebinding)
    if pending and not any(isinstance(finder, _AfterConnectorImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterConnectorImport(pending))


def gaudi_present() -> bool:
    """Whether Intel's Gaudi software is installed or the virtual Gaudi is asked for; imports nothing."""
    if os.environ.get("VIRTUAL_HPU", "").strip() == "1":
        return True
    return importlib.util.find_spec("habana_frameworks") is not None


def _use_hpu_connector(rebinding: _Rebinding, connector: ModuleType) -> None:
    module_name, attribute = rebinding.hpu.split(":")
    hpu = getattr(importlib.import_module(module_name), attribute)
    # what ours stands in for: the class it derives from, or the function it wraps
    upstream = hpu.__base__ if isinstance(hpu, type) else hpu.__wrapped__
    for module in (connector, sys.modules.get(rebinding.user)):
        if module is not None and getattr(module, rebinding.name, None) is upstream:
            setattr(module, rebinding.name, hpu)


class _AfterConnectorImport(importlib.abc.MetaPathFinder):
    """Finds upstream's connector modules as the import system would, and has each use its HPU subclass once it has
    run; steps aside after the last one."""

    def __init__(self, pending: list[_Rebinding]) -> None:
        self._pending = {rebinding.module: rebinding for rebinding in pending}

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        rebinding = self._pending.pop(fullname, None)
        if rebinding is None:
            return None
        if not self._pending:
            sys.meta_path.remove(self)
        # our finder no longer answers for it: the others find it as the import system would
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenUseHPUConnector(spec.loader, rebinding)
        return spec


class _ThenUseHPUConnector(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, rebinding: _Rebinding) -> None:
        self._loader = loader
        self._rebinding = rebinding

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # the module keeps its own loader (source lookups, reloads)
        module.__loader__ = module.__spec__.loader = self._loader  # type: ignore[union-attr]
        self._loader.exec_module(module)
        _use_hpu_connector(self._rebinding, module)
