"""fp8 training on Gaudi2 and newer: Intel Gaudi's Transformer Engine modules compute in fp8 inside
``fp8_autocast``, every other op follows bf16 autocast."""

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Optional, Union

from torch import nn
from typing_extensions import override

from lightning_fabric.plugins.precision._fp8_training import (
    fp8_recipe,
    fp8_training_context,
    prepare_for_fp8_training,
)
from lightning_fabric.plugins.precision.hpu_mixed import HPUMixedPrecision


class HPUFP8Precision(HPUMixedPrecision, builds=("fp8",)):
    """fp8 training on HPUs (Gaudi2 and newer) with Gaudi's Transformer Engine, for Fabric; the Trainer's
    :class:`pytorch_lightning.plugins.HPUFP8Precision` derives from it.

    Transformer Engine modules compute in fp8 with ``recipe``; every other op runs in bf16 autocast, with Gaudi's op
    lists as in :class:`HPUMixedPrecision`, and inputs and outputs converted as by upstream's Fabric
    ``MixedPrecision``, which it is (upstream's ``TransformerEnginePrecision`` holds the whole model in one type and
    uses NVIDIA's Transformer Engine, so it is not a base). With ``replace_layers=True`` the model's
    ``torch.nn.Linear`` layers become Transformer Engine ``Linear`` layers holding the same weights when the strategy
    sets the model up.
    ``Fabric(precision="fp8")``, ``precision="transformer-engine"`` (Fabric's fp8 flag on CUDA) and
    ``HPUPrecision(precision="fp8", ...)`` build it too.

    Args:
        precision: ``"fp8"``.
        recipe: the fp8 recipe: a ``transformer_engine.recipe.DelayedScaling``, or its arguments as a dict
            (``{"fp8_format": "HYBRID", "amax_history_len": 16}``, as from a config file); Transformer Engine's default
            ``DelayedScaling()`` when not given.
        replace_layers: put Transformer Engine ``Linear`` layers in place of the model's ``torch.nn.Linear`` layers at
            set-up. A model that already has Transformer Engine modules is left as it is.
        opt_level, bf16_file_path, fp32_file_path, verbose, hmp_params: Gaudi's op lists for the bf16 ops.
    """

    _precisions = ("fp8",)

    def __init__(
        self,
        precision: Union[str, int] = "fp8",
        opt_level: str = "O1",
        bf16_file_path: Optional[str] = None,
        fp32_file_path: Optional[str] = None,
        verbose: bool = False,
        hmp_params: Optional[dict[str, Any]] = None,
        *,
        recipe: Optional[Union[Mapping[str, Any], Any]] = None,
        replace_layers: bool = False,
    ) -> None:
        super().__init__(precision, opt_level, bf16_file_path, fp32_file_path, verbose, hmp_params)
        self.recipe = fp8_recipe(recipe)
        self.replace_layers = replace_layers

    @override
    def forward_context(self) -> AbstractContextManager:
        return fp8_training_context(self.recipe)

    @override
    def convert_module(self, module: nn.Module) -> nn.Module:
        module = super().convert_module(module)
        if self.fp8_inference(module) is None:
            prepare_for_fp8_training(module, self.replace_layers)
        return module
