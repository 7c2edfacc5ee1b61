"""FSDP2 and tensor parallelism for Fabric on Intel Gaudi: upstream's Fabric ``ModelParallelStrategy`` over HCCL."""

from typing import Any, Optional

from lightning.fabric.plugins.precision import Precision
from lightning.fabric.strategies import ModelParallelStrategy
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from lightning_fabric.strategies._hpu import (
    _HPUParallelDevicesMixin,
    _HPUStrategyMixin,
    hccl_process_group,
    sum_fsdp2_gradients,
)

# upstream's Fabric refuses the other precisions for this strategy; it cannot see ours, which arrive as plugins
_SUPPORTED_PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-true")


class HPUModelParallelStrategy(_HPUStrategyMixin, _HPUParallelDevicesMixin, ModelParallelStrategy):
    """Upstream's Fabric ``ModelParallelStrategy`` on HPUs: ``parallelize_fn(module, device_mesh)`` applies FSDP2
    (``fully_shard``) and tensor parallelism (``parallelize_module``) on a mesh of HPUs with the dimensions
    ``"data_parallel"`` and ``"tensor_parallel"``; checkpoints are distributed.

    It takes upstream's arguments (``parallelize_fn``, ``data_parallel_size``, ``tensor_parallel_size``,
    ``save_distributed_checkpoint``, ...); with ``accelerator="hpu"`` a ``ModelParallelStrategy(...)`` instance becomes
    this strategy with the same settings. It has no name, as upstream's has none: it needs the function. HCCL reduces
    with sum, min and max only, so FSDP2 is set to reduce gradients with sums (and divide) rather than averages.
    """

    def __init__(self, *args: Any, process_group_backend: Optional[str] = "hccl", **kwargs: Any) -> None:
        super().__init__(*args, process_group_backend=process_group_backend, **kwargs)

    @classmethod
    @override
    def _required_arguments(cls, strategy: Any) -> tuple:
        return (strategy._parallelize_fn,)

    @property
    @override
    def precision(self) -> Precision:
        return ModelParallelStrategy.precision.fget(self)  # type: ignore[attr-defined]

    @precision.setter
    @override
    def precision(self, precision: Optional[Precision]) -> None:
        if precision is not None and precision.precision not in _SUPPORTED_PRECISIONS:
            raise ValueError(
                f"The `ModelParallelStrategy` does not support `Fabric(..., precision={precision.precision!r})` on"
                f" HPUs. Choose a different precision among: {', '.join(_SUPPORTED_PRECISIONS)}."
            )
        ModelParallelStrategy.precision.fset(self, precision)  # type: ignore[attr-defined]

    @override
    def setup_environment(self) -> None:
        self._require_hpu_accelerator("ModelParallelStrategy")
        super().setup_environment()

    @override
    def _setup_distributed(self) -> None:
        with hccl_process_group():
            super()._setup_distributed()

    @override
    def setup_module_and_optimizers(
        self, module: Module, optimizers: list[Optimizer], scheduler: Optional[Any] = None
    ) -> tuple[Module, list[Optimizer], Optional[Any]]:
        module, optimizers, scheduler = super().setup_module_and_optimizers(module, optimizers, scheduler)
        parameters = {id(parameter) for parameter in module.parameters()}
        if any(
            id(p) not in parameters
            for optimizer in optimizers
            for group in optimizer.param_groups
            for p in group["params"]
        ):
            # upstream trains on silently, with an optimizer whose steps change nothing
            raise ValueError(
                "The optimizer was created before `fabric.setup`: `parallelize_fn` replaced the model's parameters with"
                " sharded ones, which the optimizer does not hold, so its steps would change nothing. Set up the model"
                " first (`model = fabric.setup(model)`), then create the optimizer from `model.parameters()` and call"
                " `fabric.setup_optimizers(optimizer)`."
            )
        return module, optimizers, scheduler

    @override
    def setup_module(self, module: Module) -> Module:
        module = super().setup_module(module)
        sum_fsdp2_gradients(module, "ModelParallelStrategy")
        return module
