"""DeepSpeed (ZeRO sharding, offload, activation checkpointing) for Fabric on Intel Gaudi."""

from typing import Any, Optional

from lightning.fabric.strategies import DeepSpeedStrategy, _StrategyRegistry
from typing_extensions import override

from pytorch_lightning.strategies._hpu import _HPUParallelDevicesMixin, _HPUStrategyMixin
from pytorch_lightning.strategies.hpu_deepspeed import (
    PRESETS,
    engine_in_bf16_for_fp8,
    refuse_nvme,
    use_deepspeed_hpu_accelerator,
)


class HPUDeepSpeedStrategy(_HPUStrategyMixin, _HPUParallelDevicesMixin, DeepSpeedStrategy):
    """Upstream's Fabric ``DeepSpeedStrategy`` on HPUs: one process per HPU over HCCL, DeepSpeed's HPU accelerator.

    It takes every argument of :class:`~lightning.fabric.strategies.DeepSpeedStrategy` (``stage``,
    ``offload_optimizer``, ``offload_parameters``, ``config`` as a dict or a JSON path, ...). By name it is
    ``strategy="hpu_deepspeed"`` or a ZeRO preset (``"hpu_deepspeed_stage_2"``, ...); with an HPU, upstream's
    ``"deepspeed"``, ``"deepspeed_stage_2"``, ... mean the same. Offload goes to host memory only: DeepSpeed has no
    asynchronous I/O for HPUs, so NVMe offload is refused.
    """

    strategy_name = "hpu_deepspeed"

    def __init__(self, *args: Any, process_group_backend: Optional[str] = "hccl", **kwargs: Any) -> None:
        super().__init__(*args, process_group_backend=process_group_backend, **kwargs)
        refuse_nvme(self.config, kwargs)

    @override
    def setup_environment(self) -> None:
        self._require_hpu_accelerator("DeepSpeedStrategy")
        use_deepspeed_hpu_accelerator()
        self._setup_hpu()
        # upstream's own level only refuses anything but CUDA, which this method checks for HPU first (pinned by
        # test_deepspeed_setup_environment_only_checks_for_cuda); the levels above it are the chain we need
        super(DeepSpeedStrategy, self).setup_environment()

    @override
    def _setup_distributed(self) -> None:
        # importing it registers the "hccl" backend with torch.distributed; DeepSpeed never imports it
        import habana_frameworks.torch.distributed.hccl  # noqa: F401

        super()._setup_distributed()

    @override
    def _format_config(self) -> None:
        super()._format_config()
        assert isinstance(self.config, dict)
        engine_in_bf16_for_fp8(self.config, self.precision.precision)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        for suffix, arguments in PRESETS.items():
            strategy_registry.register(
                f"{cls.strategy_name}{suffix}",
                cls,
                description=f"Fabric DeepSpeed on HPUs {arguments or 'with its default ZeRO stage 2'}",
                **arguments,
            )
