"""Precision of DeepSpeed on Intel Gaudi: the engine's fp32, bf16 or fp16 training, and fp8 for Transformer Engine
modules."""

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Optional, Union

import torch
from lightning.fabric.plugins.precision.deepspeed import DeepSpeedPrecision
from lightning.fabric.plugins.precision.utils import _convert_fp_tensor, _DtypeContextManager
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor
from torch.nn import Module

from lightning_fabric.plugins.precision import _fp8_training
from lightning_fabric.plugins.precision.hpu import SUPPORTED, HPUPrecision, check_device, validate_precision
from lightning_fabric.plugins.precision.hpu_mixed import AUTOCAST_DTYPES


class HPUDeepSpeedMixin:
    """What DeepSpeed's precision plugin is on HPUs, of Fabric (:class:`HPUDeepSpeedPrecision`) and of the Trainer
    (:class:`pytorch_lightning.plugins.HPUDeepSpeedPrecisionPlugin`): mixed in before upstream's ``DeepSpeedPrecision``
    of each, and then the HPU precision base of each.

    With ``"bf16-mixed"`` or ``"16-mixed"`` (Gaudi2 and newer) DeepSpeed's engine keeps the model in bf16/fp16 and
    fp32 master weights in its optimizer; floating-point inputs are cast to that type. Backward, the optimizer step and
    gradient clipping are the engine's. ``Trainer(strategy="hpu_deepspeed", precision=...)`` builds it; upstream's
    ``DeepSpeedPrecision`` passed in ``plugins`` with HPU becomes this plugin.
    Under DeepSpeed's inference engine with a dtype of its own (``HPUDeepSpeedStrategy(dtype=...)`` for ``test`` and
    ``predict``), the engine's dtype wins: it holds the weights, floating-point inputs are cast to it and tensors made
    in the steps take it; the mixed precisions then run the steps in ``torch.autocast("hpu")``, as lightning-habana
    did, so that the ops in Gaudi's lower-precision list still compute in bf16/fp16.
    With ``"fp8"`` (Gaudi2 and newer) the engine works in bf16 as for ``"bf16-mixed"``, and Transformer Engine modules
    compute in fp8 with ``recipe``, as with :class:`HPUFP8Precision`; :meth:`convert_modules` prepares a model for fp8
    inference (quantized models run with ZeRO stages 0 to 2).

    Args:
        precision: ``"32-true"``, ``"bf16-mixed"``, ``"16-mixed"``, ``"bf16-true"``, ``"16-true"``, ``"fp8"``, or a
            legacy form (32, 16, ``"bf16"``).
        device: ``"hpu"`` (lightning-habana's signature, ``HPUDeepSpeedPrecisionPlugin(precision, device="hpu")``).
        recipe: for ``"fp8"``: a ``DelayedScaling`` recipe or its arguments as a dict.
        replace_layers: for ``"fp8"``: put Transformer Engine ``Linear`` layers in place of the model's linear layers
            at set-up.
    """

    precision: str
    # the floating-point dtype of DeepSpeed's inference engine while the strategy runs one, else ``None``
    inference_dtype: Optional[torch.dtype] = None

    def __init__(
        self,
        precision: Union[str, int] = "32-true",
        *,
        device: Union[str, torch.device] = "hpu",
        recipe: Optional[Union[Mapping[str, Any], Any]] = None,
        replace_layers: bool = False,
    ) -> None:
        check_device(device, type(self).__name__)
        validated = validate_precision(precision, SUPPORTED, type(self).__name__)
        # under fp8, DeepSpeed's engine holds the model and casts the inputs as for bf16 (upstream's constructor)
        super().__init__("bf16-mixed" if validated == "fp8" else validated)  # type: ignore[call-arg]
        self.precision = validated
        self.recipe = _fp8_training.fp8_recipe(recipe)
        self.replace_layers = replace_layers

    def convert_module(self, module: Module) -> Module:
        # upstream's `convert_module`, which comes next, does not pass the module on to the HPU base
        self._start_run(module)  # type: ignore[attr-defined]
        module = super().convert_module(module)  # type: ignore[misc]
        if self.precision == "fp8" and self.fp8_inference(module) is None:  # type: ignore[attr-defined]
            _fp8_training.prepare_for_fp8_training(module, self.replace_layers)
        return module

    def convert_input(self, data: Any) -> Any:
        if self.inference_dtype is None:
            return super().convert_input(data)  # type: ignore[misc]
        return apply_to_collection(data, Tensor, function=_convert_fp_tensor, dst_type=self.inference_dtype)

    def forward_context(self) -> AbstractContextManager:
        if self.inference_dtype is not None:
            if self.precision in AUTOCAST_DTYPES:
                return torch.autocast("hpu", dtype=AUTOCAST_DTYPES[self.precision])
            return _DtypeContextManager(self.inference_dtype)
        if self.precision == "fp8":
            return _fp8_training.fp8_training_context(self.recipe)
        return super().forward_context()  # type: ignore[misc]

    def teardown(self) -> None:
        self.inference_dtype = None
        super().teardown()  # type: ignore[misc]


class HPUDeepSpeedPrecision(HPUDeepSpeedMixin, DeepSpeedPrecision, HPUPrecision):
    """Precision for Fabric's DeepSpeed on HPUs (see :class:`HPUDeepSpeedMixin`), with backward and the step left to
    DeepSpeed's engine, and outputs leaving the model in the default type, as upstream's Fabric ``DeepSpeedPrecision``
    does, which it is."""

    _entry_point = "HPUDeepSpeedPrecision"
