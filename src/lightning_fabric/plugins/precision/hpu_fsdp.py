"""Precision of FSDP on Intel Gaudi: FSDP's ``MixedPrecision`` (parameter, reduce and buffer dtypes) with Gaudi's
autocast."""

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Optional, Union

import torch
from lightning.fabric.plugins.precision.fsdp import FSDPPrecision
from typing_extensions import override

from lightning_fabric.plugins.precision.hpu import HPUPrecision, check_device, validate_precision

if TYPE_CHECKING:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

_FSDP_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")


class HPUFSDPPrecision(HPUPrecision, FSDPPrecision):
    """Upstream's Fabric ``FSDPPrecision`` on HPUs: FSDP holds the parameters in ``precision``'s type, reduces gradients
    and keeps buffers in it; the mixed precisions also run the steps in ``torch.autocast("hpu")``. The Trainer's
    :class:`pytorch_lightning.plugins.HPUFSDPPrecision` derives from it.

    ``Fabric(accelerator="hpu", strategy="fsdp", precision=...)`` builds it; it is an ``FSDPPrecision``, as Fabric's
    FSDP strategy requires. ``"16-mixed"`` and ``"16-true"`` need
    Gaudi2 or newer; ``"16-mixed"`` scales the loss with FSDP's sharded gradient scaler, as on CUDA. fp8 is refused:
    FSDP shards the weights that Transformer Engine would keep in fp8 (use DeepSpeed for fp8 training).

    Args:
        precision: ``"32-true"``, ``"bf16-mixed"``, ``"16-mixed"``, ``"bf16-true"`` or ``"16-true"``.
        scaler: for ``"16-mixed"``, a ``ShardedGradScaler`` of your own; one on ``"hpu"`` otherwise.
        device, recipe, replace_layers: lightning-habana's signature, ``HPUFSDPPrecision(precision, device="hpu",
            recipe=None, replace_layers=False)``: ``device`` must be ``"hpu"``; ``recipe`` and ``replace_layers``,
            which lightning-habana ignored, are refused when set, as FSDP does not train in fp8 here.
    """

    _entry_point = "HPUFSDPPrecision"

    def __init__(
        self,
        precision: Union[str, int] = "32-true",
        scaler: Optional["ShardedGradScaler"] = None,
        *,
        device: Union[str, torch.device] = "hpu",
        recipe: Optional[Union[Mapping[str, Any], Any]] = None,
        replace_layers: bool = False,
    ) -> None:
        check_device(device, type(self).__name__)
        if recipe is not None or replace_layers:
            raise ValueError(
                f"`{type(self).__name__}` takes `recipe` and `replace_layers` for lightning-habana's signature only:"
                " FSDP does not train in fp8 on HPUs. Leave them out, or use fp8 with `strategy='hpu_parallel'` or"
                " DeepSpeed."
            )
        if precision == "fp8":
            raise ValueError(
                "FSDP does not train in `precision='fp8'` on HPUs: it shards the weights that Transformer Engine keeps"
                " in fp8. Use `precision='bf16-mixed'` with FSDP, or fp8 with `strategy='hpu_parallel'` or DeepSpeed."
            )
        validated = validate_precision(precision, _FSDP_PRECISIONS, type(self).__name__)
        if validated == "16-mixed" and scaler is None:
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            scaler = ShardedGradScaler(device="hpu")
        # upstream checks a given scaler against `self.precision` before it sets it (lightning 2.6)
        self.precision = validated
        FSDPPrecision.__init__(self, validated, scaler)  # type: ignore[arg-type]
        # and then keeps only the default scaler it makes itself (lightning 2.6), a CUDA one: keep the HPU's
        self.scaler = scaler

    @override
    def forward_context(self) -> AbstractContextManager:
        if "mixed" in self.precision:
            return torch.autocast("hpu", dtype=torch.bfloat16 if self.precision == "bf16-mixed" else torch.float16)
        return super().forward_context()
