"""Precision for Fabric on Intel Gaudi: the HPU precision plugins of the Trainer, with Fabric's backward and step.

An HPU plugin's precision behaviour (autocast with Gaudi's op lists, half weights, fp8 with Transformer Engine, fp8
measurements) is the Trainer plugin's. Only the backward and optimizer-step hooks differ: the Trainer plugins inherit
``lightning.pytorch``'s, which run LightningModule hooks and a closure; Fabric calls these with any module and no
closure, as upstream's Fabric plugins define them.
"""

import torch
from lightning.fabric.plugins.precision.amp import MixedPrecision as _FabricMixedPrecision
from lightning.fabric.plugins.precision.deepspeed import DeepSpeedPrecision as _FabricDeepSpeedPrecision
from lightning.fabric.plugins.precision.fsdp import FSDPPrecision as _FabricFSDPPrecision
from lightning.fabric.plugins.precision.half import HalfPrecision as _FabricHalfPrecision
from lightning.fabric.plugins.precision.precision import Precision as _FabricPrecision

from pytorch_lightning.plugins.precision import hpu, hpu_deepspeed, hpu_fp8, hpu_fsdp, hpu_half, hpu_mixed


class FabricHooks:
    """Fabric's backward and optimizer-step hooks, placed before a Trainer plugin's in the method order: every HPU
    plugin for Fabric has them."""

    pre_backward = _FabricPrecision.pre_backward
    backward = _FabricPrecision.backward
    post_backward = _FabricPrecision.post_backward
    optimizer_step = _FabricPrecision.optimizer_step


class _AutocastInputDtype:
    """The type upstream's Fabric ``MixedPrecision`` casts floating-point inputs to (and that its compute-dtype lookup
    reads), set there by a constructor the HPU plugins do not run: the autocast type of the precision."""

    precision: str

    @property
    def _desired_input_dtype(self) -> torch.dtype:
        return hpu_mixed.AUTOCAST_DTYPES[self.precision]


class HPUMixedPrecision(FabricHooks, _AutocastInputDtype, hpu_mixed.HPUMixedPrecision, _FabricMixedPrecision):
    """Fabric's ``precision="bf16-mixed"`` / ``"16-mixed"`` on HPUs: ``torch.autocast("hpu")`` with Gaudi's op lists,
    as :class:`pytorch_lightning.plugins.HPUMixedPrecision`; inputs enter the model in the autocast type and outputs
    leave it in the default type, as with upstream's Fabric ``MixedPrecision``, which it is."""


class HPUHalfPrecision(FabricHooks, hpu_half.HPUHalfPrecision, _FabricHalfPrecision):
    """Fabric's ``precision="bf16-true"`` / ``"16-true"`` on HPUs, as
    :class:`pytorch_lightning.plugins.HPUHalfPrecision`; outputs leave the model in the default type, as with upstream's
    Fabric ``HalfPrecision``, which it is."""


class HPUFP8Precision(FabricHooks, _AutocastInputDtype, hpu_fp8.HPUFP8Precision, _FabricMixedPrecision):
    """Fabric's fp8 training on HPUs (Gaudi2 and newer) with Gaudi's Transformer Engine:
    :class:`pytorch_lightning.plugins.HPUFP8Precision`. ``precision="transformer-engine"``, Fabric's fp8 flag on CUDA,
    builds it too. The ops outside Transformer Engine modules run in bf16 autocast, with inputs and outputs converted
    as by upstream's Fabric ``MixedPrecision``, which it is; upstream's ``TransformerEnginePrecision`` holds the whole
    model in one type and uses NVIDIA's Transformer Engine, so it is not a base."""


class HPUPrecision(FabricHooks, hpu.HPUPrecisionPlugin):
    """Precision for Fabric on HPUs, and plain fp32 (``"32-true"``) itself.

    ``HPUPrecision(precision=...)``, lightning-habana's Fabric plugin, builds the plugin for that precision:
    ``"bf16-mixed"``/``"16-mixed"`` give :class:`HPUMixedPrecision`, ``"bf16-true"``/``"16-true"``
    :class:`HPUHalfPrecision`, ``"fp8"`` :class:`HPUFP8Precision`. ``Fabric(accelerator="hpu", precision=...)``
    builds the same plugins. The arguments are those of :class:`pytorch_lightning.plugins.HPUPrecisionPlugin`.
    """

    _entry_point = "HPUPrecision"

    @staticmethod
    def _classes_by_precision() -> dict[str, type[hpu.HPUPrecisionPlugin]]:
        return {
            "bf16-mixed": HPUMixedPrecision,
            "16-mixed": HPUMixedPrecision,
            "bf16-true": HPUHalfPrecision,
            "16-true": HPUHalfPrecision,
            "fp8": HPUFP8Precision,
        }


class HPUDeepSpeedPrecision(FabricHooks, hpu_deepspeed.HPUDeepSpeedPrecisionPlugin, _FabricDeepSpeedPrecision):
    """Precision for Fabric's DeepSpeed on HPUs: :class:`pytorch_lightning.plugins.HPUDeepSpeedPrecisionPlugin`, with
    backward and the step left to DeepSpeed's engine, and outputs leaving the model in the default type, as upstream's
    Fabric ``DeepSpeedPrecision`` does, which it is."""

    _entry_point = "HPUDeepSpeedPrecision"
    backward = _FabricDeepSpeedPrecision.backward
    optimizer_step = _FabricDeepSpeedPrecision.optimizer_step


class HPUFSDPPrecision(FabricHooks, hpu_fsdp.HPUFSDPPrecision, _FabricFSDPPrecision):
    """Precision for Fabric's FSDP on HPUs: :class:`pytorch_lightning.plugins.HPUFSDPPrecision` (FSDP's
    ``MixedPrecision`` with Gaudi's autocast), with the loss scaling of upstream's Fabric ``FSDPPrecision`` for
    ``"16-mixed"``; it is one, as Fabric's FSDP strategy requires."""

    _entry_point = "HPUFSDPPrecision"
    backward = _FabricFSDPPrecision.backward
    optimizer_step = _FabricFSDPPrecision.optimizer_step
    unscale_gradients = _FabricFSDPPrecision.unscale_gradients
