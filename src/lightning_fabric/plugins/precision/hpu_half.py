"""True half precision on Intel Gaudi: the model's weights, its floating-point inputs and the tensors created in
``forward`` in bf16 or fp16, without autocast."""

from typing import Union

from lightning.fabric.plugins.precision.half import HalfPrecision

from lightning_fabric.plugins.precision.hpu import HPUPrecision, validate_precision


class HPUHalfPrecision(HPUPrecision, HalfPrecision, builds=("bf16-true", "16-true")):
    """Upstream's Fabric ``HalfPrecision`` on HPUs: ``"bf16-true"``, or ``"16-true"`` on Gaudi2 and newer; outputs leave
    the model in the default type, as with upstream's. The Trainer's :class:`pytorch_lightning.plugins.HPUHalfPrecision`
    derives from it.

    ``Fabric(accelerator="hpu", precision="bf16-true")`` builds it. The precisions mean what they mean on every other
    device; a first-generation Gaudi refuses fp16 here, when the plugin is built.
    """

    def __init__(self, precision: Union[str, int] = "bf16-true") -> None:
        HalfPrecision.__init__(self, validate_precision(precision, ("bf16-true", "16-true"), type(self).__name__))  # type: ignore[arg-type]
