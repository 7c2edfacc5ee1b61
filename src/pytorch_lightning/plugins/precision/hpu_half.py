"""True half precision on Intel Gaudi: the model's weights, its floating-point inputs and the tensors created in
``forward`` in bf16 or fp16, without autocast."""

from typing import Union

from lightning.pytorch.plugins.precision.half import HalfPrecision

from pytorch_lightning.plugins.precision.hpu import HPUPrecisionPlugin, validate_precision


class HPUHalfPrecision(HPUPrecisionPlugin, HalfPrecision):
    """Upstream's ``HalfPrecision`` on HPUs: ``"bf16-true"``, or ``"16-true"`` on Gaudi2 and newer.

    ``Trainer(accelerator="hpu", precision="bf16-true")`` builds it. The precisions mean what they mean on every other
    device; a first-generation Gaudi refuses fp16 here, when the plugin is built.
    """

    def __init__(self, precision: Union[str, int] = "bf16-true") -> None:
        HalfPrecision.__init__(self, validate_precision(precision, ("bf16-true", "16-true"), type(self).__name__))  # type: ignore[arg-type]
