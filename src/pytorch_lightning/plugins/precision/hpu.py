"""Precision on Intel Gaudi in the Trainer: the base of the Trainer's HPU precision plugins, fp32 itself, and the entry
point that builds the plugin for a precision (``HPUPrecisionPlugin(precision="bf16-mixed")``), as Lightning 1.x and
lightning-habana did. Fabric's :class:`lightning_fabric.plugins.HPUPrecision` holds the behaviour; this adds the
Trainer's hooks (LightningModule backward and closures)."""

from functools import cached_property
from typing import Any, Union

from lightning.pytorch.plugins.precision.precision import Precision
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from lightning_fabric.plugins.precision.hpu import HPUPrecision
from lightning_fabric.strategies.hpu_clip import HPUGradientClipper


class HPUPrecisionPlugin(Precision, HPUPrecision):
    """Precision on HPUs; the base of the Trainer's HPU precision plugins, and plain fp32 (``"32-true"``) itself.

    ``HPUPrecisionPlugin(precision=...)`` builds the plugin for that precision, so code written for Lightning 1.x or
    lightning-habana keeps working: ``"bf16-mixed"``/``"16-mixed"`` (and the legacy ``16``, ``"16"``) give
    :class:`HPUMixedPrecision`, ``"bf16-true"``/``"16-true"`` :class:`HPUHalfPrecision`, ``"fp8"``
    :class:`HPUFP8Precision`. The Trainer's ``precision`` flag builds the same plugins. The arguments, and the fp8
    methods (:meth:`convert_modules`), are those of Fabric's :class:`lightning_fabric.plugins.HPUPrecision`.

    ``gradient_clip_val`` with the ``"norm"`` algorithm clips with Gaudi's fused clip-norm
    (:class:`lightning_fabric.strategies.hpu_clip.HPUGradientClipper`).
    """

    _entry_point = "HPUPrecisionPlugin"
    _owner = "Trainer"
    _by_precision: dict[str, type[Any]] = {}

    @override
    def convert_module(self, module: Module) -> Module:
        # upstream's Trainer plugins, which come next for the subclasses, convert the module without passing it on
        self._start_run(module)
        return super().convert_module(module)

    @override
    def clip_grad_by_norm(self, optimizer: Optimizer, clip_val: Union[int, float]) -> None:
        self._gradient_clipper.clip_grad_norm_(self.main_params(optimizer), clip_val)

    @cached_property
    def _gradient_clipper(self) -> HPUGradientClipper:
        return HPUGradientClipper()
