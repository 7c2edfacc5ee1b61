"""DDP's options on Gaudi: the ones Intel recommends for HCCL, wherever the user left DDP's own default."""

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

# Intel's recommendations for DistributedDataParallel over HCCL (docs/source-pytorch/hpu_intermediate.rst, "Tuning
# data-parallel training", has the sources):
HCCL_DDP_OPTIONS: Mapping[str, Any] = MappingProxyType(
    {
        # optimum-habana's default (GaudiTrainingArguments.ddp_bucket_cap_mb) and Model-References' BERT: fewer,
        # larger all-reduces than torch's 25 MB
        "bucket_cap_mb": 230,
        # optimum-habana sets it on every HPU run; Intel's guide: fewer device-to-device copies, less memory
        "gradient_as_bucket_view": True,
    }
)


class _HCCLDDPOptionsMixin:
    """For the HPU data-parallel strategies of Fabric and the Trainer: DDP's options are Intel's for HCCL
    (:data:`HCCL_DDP_OPTIONS`) unless given, to the strategy or to the upstream ``DDPStrategy`` it is converted from."""

    _ddp_kwargs: dict[str, Any]  # upstream DDPStrategy's: the options it passes to DistributedDataParallel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._complete_ddp_options()

    @classmethod
    def from_upstream(cls, strategy: Any) -> Any:
        hpu = super().from_upstream(strategy)  # type: ignore[misc]
        hpu._complete_ddp_options()
        return hpu

    def _complete_ddp_options(self) -> None:
        self._ddp_kwargs = {**HCCL_DDP_OPTIONS, **self._ddp_kwargs}
