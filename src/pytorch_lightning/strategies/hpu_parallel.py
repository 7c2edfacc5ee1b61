"""Strategy for data-parallel training over several Intel Gaudi devices and nodes."""

from typing import Any, Optional

from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.overrides.distributed import _register_ddp_comm_hook
from lightning.pytorch.strategies.ddp import DDPStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_fabric.strategies._hpu import _HPUParallelDevicesMixin, hccl_ddp_names, hccl_process_group
from lightning_fabric.strategies.hpu_ddp_options import _HCCLDDPOptionsMixin
from pytorch_lightning.plugins.precision.hpu import HPUPrecisionPlugin
from pytorch_lightning.strategies._hpu import _HPUTrainerStrategyMixin


class HPUParallelStrategy(_HCCLDDPOptionsMixin, _HPUTrainerStrategyMixin, _HPUParallelDevicesMixin, DDPStrategy):
    """DistributedDataParallel over HCCL, one process per HPU.

    ``Trainer(accelerator="hpu", devices=N)`` with ``N > 1`` or ``num_nodes > 1`` picks it; by name it is
    ``strategy="hpu_parallel"`` (processes started as a subprocess of the script) or ``"hpu_parallel_spawn"``; also
    ``"hpu_ddp"`` and ``HPUDDPStrategy``, lightning-habana's names for it.
    Gradients are synchronised by DDP; its options (``find_unused_parameters``, ``static_graph``,
    ``bucket_cap_mb``, ``gradient_as_bucket_view``, ``ddp_comm_hook``, ...) pass through as for ``DDPStrategy``;
    those not given are Intel's for HCCL (``bucket_cap_mb=230``, ``gradient_as_bucket_view=True``).
    """

    strategy_name = "hpu_parallel"

    def __init__(self, *args: Any, process_group_backend: Optional[str] = "hccl", **kwargs: Any) -> None:
        super().__init__(*args, process_group_backend=process_group_backend, **kwargs)

    @override
    def connect(self, model: Any) -> None:
        if isinstance(self.precision_plugin, HPUPrecisionPlugin) and self.precision_plugin.fp8_inference(model):
            raise MisconfigurationException(
                "fp8 inference with Intel Neural Compressor is not supported with `strategy='hpu_parallel'`: run it on"
                " one device (`devices=1`, strategy 'hpu_single') or with `strategy='hpu_deepspeed'` and"
                " `HPUDeepSpeedPrecisionPlugin(precision='fp8')`."
            )
        super().connect(model)

    @override
    def setup_distributed(self) -> None:
        with hccl_process_group():
            super().setup_distributed()

    @override
    def determine_ddp_device_ids(self) -> None:
        # each process drives exactly one HPU, which the module already lives on
        return None

    @override
    def _register_ddp_hooks(self) -> None:
        # upstream registers communication hooks on CUDA only; DDP runs them over HCCL as well
        _register_ddp_comm_hook(
            model=self.model,
            ddp_comm_state=self._ddp_comm_state,
            ddp_comm_hook=self._ddp_comm_hook,
            ddp_comm_wrapper=self._ddp_comm_wrapper,
        )

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        for name, start_method in hccl_ddp_names(cls.strategy_name):
            strategy_registry.register(
                name,
                cls,
                description=f"DDP over HCCL on HPUs, processes started with '{start_method}'",
                start_method=start_method,
            )


# lightning-habana's name for the class
HPUDDPStrategy = HPUParallelStrategy
