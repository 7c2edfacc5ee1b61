"""Precision of FSDP on Intel Gaudi in the Trainer: FSDP's ``MixedPrecision`` (parameter, reduce and buffer dtypes)
with Gaudi's autocast."""

from lightning.pytorch.plugins.precision.fsdp import FSDPPrecision

from lightning_fabric.plugins.precision.hpu_fsdp import HPUFSDPPrecision as FabricHPUFSDPPrecision
from pytorch_lightning.plugins.precision.hpu import HPUPrecisionPlugin


class HPUFSDPPrecision(FabricHPUFSDPPrecision, HPUPrecisionPlugin, FSDPPrecision):
    """Upstream's ``FSDPPrecision`` on HPUs: FSDP holds the parameters in ``precision``'s type, reduces gradients and
    keeps buffers in it; the mixed precisions also run the steps in ``torch.autocast("hpu")``.

    ``Trainer(accelerator="hpu", strategy="fsdp", precision=...)`` builds it. ``"16-mixed"`` and ``"16-true"`` need
    Gaudi2 or newer; ``"16-mixed"`` scales the loss with FSDP's sharded gradient scaler, as on CUDA. fp8 is refused:
    FSDP shards the weights that Transformer Engine would keep in fp8 (use DeepSpeed for fp8 training).

    Args:
        precision: ``"32-true"``, ``"bf16-mixed"``, ``"16-mixed"``, ``"bf16-true"`` or ``"16-true"``.
        scaler: for ``"16-mixed"``, a ``ShardedGradScaler`` of your own; one on ``"hpu"`` otherwise.
        device, recipe, replace_layers: lightning-habana's signature, ``HPUFSDPPrecision(precision, device="hpu",
            recipe=None, replace_layers=False)``: ``device`` must be ``"hpu"``; ``recipe`` and ``replace_layers``,
            which lightning-habana ignored, are refused when set, as FSDP does not train in fp8 here.
    """
