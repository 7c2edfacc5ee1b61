"""Accelerator for Intel Gaudi devices (HPUs): the device logic, shared by Fabric and the Trainer."""

import importlib.util
from types import ModuleType
from typing import Union

import torch
from lightning.fabric.accelerators.accelerator import Accelerator
from lightning.fabric.accelerators.registry import _AcceleratorRegistry
from lightning.fabric.utilities.exceptions import MisconfigurationException
from typing_extensions import override


class HPUAccelerator(Accelerator):
    """Accelerator for Intel Gaudi devices (HPUs), real or virtual: Fabric's, and the device logic of the Trainer's
    (:class:`pytorch_lightning.accelerators.HPUAccelerator`, which adds device statistics).

    Select it with ``Fabric(accelerator="hpu")``; ``accelerator="auto"`` picks it whenever a Gaudi is present.
    """

    # the connectors refuse other strategies with an HPU, but one set up without them (or upstream's connectors, with
    # ours switched off) would fail far from the cause (CUDA streams, collectives on the wrong device): only an HPU
    # strategy's accelerator sets devices up
    _driven_by_hpu_strategy: bool = False

    def attach_hpu_strategy(self) -> None:
        """Called by an HPU strategy given this accelerator; the accelerator then sets up its devices."""
        self._driven_by_hpu_strategy = True

    @override
    def setup_device(self, device: torch.device) -> None:
        if device.type != "hpu":
            raise MisconfigurationException(_needs_an_hpu_strategy(f"its strategy put the model on `{device}`"))
        if not self._driven_by_hpu_strategy:
            raise MisconfigurationException(_needs_an_hpu_strategy("its strategy is not one of them"))
        from virtual_hpu.torch_support import check_torch

        # on a Gaudi, whose bridge accepts only its own torch: an older Gaudi release than the range starts at
        check_torch(torch.__version__, "Lightning's HPU support")
        if device.index is not None:
            hthpu = _bridge_hpu_module()
            # what torch places on "the current HPU" (FSDP2, DTensor meshes) goes to this process's device
            hthpu.set_device(device)

    @override
    def teardown(self) -> None:
        pass

    @staticmethod
    @override
    def parse_devices(devices: Union[int, str]) -> int:
        """Turn the ``devices`` flag into a number of HPUs.

        Gaudi processes own whole cards, so only a count is meaningful: an ``int``, its string form, ``-1`` or
        ``"auto"`` for all of them. Lists of indices are refused.
        """
        if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
            devices = int(devices)
        if devices == "auto" or devices == -1:
            return HPUAccelerator.auto_device_count()
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise MisconfigurationException(
                f"`accelerator='hpu', devices={devices!r}` is not a valid input: HPU devices are selected by"
                " count. Pass a positive int (e.g. `devices=8`), -1 or 'auto' to use all of them."
            )
        available = HPUAccelerator.auto_device_count()
        if devices > available:
            raise MisconfigurationException(
                f"`accelerator='hpu', devices={devices}` requested {devices} HPUs but only {available}"
                f" {'is' if available == 1 else 'are'} available. Pass `devices={available}` or fewer."
            )
        return devices

    @staticmethod
    @override
    def get_parallel_devices(devices: int) -> list[torch.device]:
        return [torch.device("hpu", index) for index in range(devices)]

    @staticmethod
    @override
    def auto_device_count() -> int:
        if not HPUAccelerator.is_available():
            return 0
        hthpu = _bridge_hpu_module()
        return hthpu.device_count()

    @staticmethod
    @override
    def is_available() -> bool:
        """Whether the Gaudi software stack, real or virtual, is importable and sees at least one device."""
        if importlib.util.find_spec("habana_frameworks") is None:
            return False
        hthpu = _bridge_hpu_module()
        return bool(hthpu.is_available())

    @staticmethod
    def get_device_name() -> str:
        """The Gaudi generation: ``"GAUDI"``, ``"GAUDI2"`` or ``"GAUDI3"``; empty when no HPU is present."""
        if not HPUAccelerator.is_available():
            return ""
        hthpu = _bridge_hpu_module()
        return hthpu.get_device_name()

    @staticmethod
    def describe() -> str:
        """What the HPUs are, for logs and reports: ``"GAUDI2"``, ``"virtual GAUDI2"``; empty when none is present."""
        name = HPUAccelerator.get_device_name()
        return f"virtual {name}" if name and HPUAccelerator.is_virtual() else name

    @staticmethod
    def is_lazy() -> bool:
        """Whether the HPUs run in lazy mode (``PT_HPU_LAZY_MODE=1``), where ``mark_step()`` cuts the graphs."""
        import habana_frameworks.torch.core as htcore

        return htcore.is_lazy()

    @staticmethod
    def is_virtual() -> bool:
        """Whether the HPUs are the virtual Gaudi (host memory) rather than real hardware."""
        import sys

        virtual_hpu = sys.modules.get("virtual_hpu")
        return virtual_hpu is not None and virtual_hpu.is_active()

    @staticmethod
    @override
    def name() -> str:
        return "hpu"

    @classmethod
    @override
    def register_accelerators(cls, accelerator_registry: _AcceleratorRegistry) -> None:
        accelerator_registry.register(cls.name(), cls, description=cls.__name__)


def _needs_an_hpu_strategy(problem: str) -> str:
    return (
        f"`HPUAccelerator` trains only under an HPU strategy, but {problem}. The Trainer and Fabric (`lightning`'s and"
        " `pytorch_lightning`'s alike) choose one for `accelerator='hpu'`; elsewhere, pass one of"
        " `lightning_fabric.strategies` to Fabric or of `pytorch_lightning.strategies` to the Trainer"
        " (`SingleHPUStrategy()`, `HPUParallelStrategy()`, ...) explicitly."
    )


def _bridge_hpu_module() -> ModuleType:
    """Gaudi's ``habana_frameworks.torch.hpu``, loading the bridge if needed; its refusal of lazy mode on an image with
    stock PyTorch becomes an error that names the fix."""
    try:
        import habana_frameworks.torch.hpu as hthpu
    except AssertionError as error:
        # the bridge's words: "Upstream PyTorch version ..." (1.24), "Stock PyTorch version ..." (1.22, 1.23)
        if "not supported in Lazy mode" not in str(error):
            raise
        raise MisconfigurationException(
            f"Lazy mode (`PT_HPU_LAZY_MODE=1`) needs Intel's own PyTorch build, and this Gaudi image has stock PyTorch"
            f" {torch.__version__}: Gaudi's bridge refuses to load ({error}). Lazy mode's features (HPU graphs,"
            " `mark_step`) are not available on such images. Run in eager mode: unset `PT_HPU_LAZY_MODE` (or set it"
            " to 0) and compile with `torch.compile(model, backend='hpu_backend')`; or use a Gaudi image with Intel's"
            " PyTorch."
        ) from error
    return hthpu
