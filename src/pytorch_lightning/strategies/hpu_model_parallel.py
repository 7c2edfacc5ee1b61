"""FSDP2 and tensor parallelism on Intel Gaudi: upstream's ``ModelParallelStrategy`` over HCCL."""

from typing import Any, Optional

from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_fabric.strategies._hpu import _HPUParallelDevicesMixin, hccl_process_group, sum_fsdp2_gradients
from pytorch_lightning.strategies._hpu import _HPUTrainerStrategyMixin


class HPUModelParallelStrategy(_HPUTrainerStrategyMixin, _HPUParallelDevicesMixin, ModelParallelStrategy):
    """Upstream's ``ModelParallelStrategy`` on HPUs: the LightningModule's ``configure_model`` applies FSDP2
    (``fully_shard``) and tensor parallelism (``parallelize_module``) on ``self.device_mesh``, a mesh of HPUs with the
    dimensions ``"data_parallel"`` and ``"tensor_parallel"``; checkpoints are distributed.

    It takes upstream's arguments (``data_parallel_size``, ``tensor_parallel_size``, ``save_distributed_checkpoint``,
    ...). By name it is ``strategy="hpu_model_parallel"``; with ``accelerator="hpu"`` upstream's ``"model_parallel"``
    and a ``ModelParallelStrategy(...)`` instance mean the same. HCCL reduces with sum, min and max only, so FSDP2 is
    set to reduce gradients with sums (and divide) rather than averages.
    """

    strategy_name = "hpu_model_parallel"

    def __init__(self, *args: Any, process_group_backend: Optional[str] = "hccl", **kwargs: Any) -> None:
        super().__init__(*args, process_group_backend=process_group_backend, **kwargs)

    @property
    @override
    def precision_plugin(self) -> Precision:
        return super().precision_plugin

    @precision_plugin.setter
    @override
    def precision_plugin(self, precision_plugin: Optional[Precision]) -> None:
        if precision_plugin is not None and precision_plugin.precision == "fp8":
            raise MisconfigurationException(
                "`precision='fp8'` does not run with FSDP2 and tensor parallelism on HPUs: `configure_model` shards the"
                " layers that Transformer Engine would replace. Use `precision='bf16-mixed'` here, or fp8 with"
                " `strategy='hpu_parallel'` or DeepSpeed."
            )
        ModelParallelStrategy.precision_plugin.fset(self, precision_plugin)  # type: ignore[attr-defined]

    @override
    def setup_environment(self) -> None:
        self._require_hpu_accelerator("ModelParallelStrategy")
        super().setup_environment()

    @override
    def _setup_distributed(self) -> None:
        with hccl_process_group():
            super()._setup_distributed()

    @override
    def setup(self, trainer: Any) -> None:
        super().setup(trainer)
        sum_fsdp2_gradients(self.model, "ModelParallelStrategy")  # type: ignore[arg-type]

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(cls.strategy_name, cls, description="FSDP2 and tensor parallelism on HPUs over HCCL")
