"""fp8 inference on Gaudi2 and newer with Intel Neural Compressor: one process measures the model's tensors, a later
one quantizes the model from those measurements."""

from typing import Optional, Union

from torch import nn
from typing_extensions import override

from lightning_fabric.plugins.precision._fp8_inference import (
    FP8InferenceConfig,
    convert_for_inference,
    prepared_config,
    resolve_config,
)
from lightning_fabric.plugins.precision.hpu_mixed import HPUMixedPrecision


class HPUFP8InferencePrecision(HPUMixedPrecision):
    """fp8 inference on HPUs (Gaudi2 and newer) with Intel Neural Compressor, in two processes: ``quant=False``
    measures the model's tensors when the strategy sets it up (written under ``fp8_data_path`` when the run succeeds:
    under Fabric, at ``fabric.strategy.teardown()``), ``quant=True`` in a later process quantizes it from them. Other
    ops run in bf16 autocast. The Trainer's :class:`pytorch_lightning.plugins.HPUFP8InferencePrecision` derives from it,
    and documents the arguments.
    """

    _precisions = ("fp8",)

    def __init__(self, quant: Union[bool, str, dict] = True, fp8_data_path: Optional[str] = None) -> None:
        super().__init__("fp8")
        self.config = resolve_config(quant, fp8_data_path)

    @override
    def fp8_inference(self, module: nn.Module) -> FP8InferenceConfig:
        return self.config

    @override
    def convert_module(self, module: nn.Module) -> nn.Module:
        if prepared_config(module) is None:
            module = convert_for_inference(module, self.config)
        return super().convert_module(module)
