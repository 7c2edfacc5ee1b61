"""DeepSpeed (ZeRO sharding, offload, bf16 optimizers, activation checkpointing) on Intel Gaudi."""

import inspect
from typing import Any, Callable, Optional

import torch
from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.core.optimizer import _MockOptimizer
from lightning.pytorch.strategies.deepspeed import DeepSpeedStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import Tensor
from torch.nn import Module
from typing_extensions import override

from lightning_fabric.strategies._hpu import _HPUParallelDevicesMixin
from lightning_fabric.strategies.hpu_deepspeed import (
    PRESETS,
    engine_in_bf16_for_fp8,
    refuse_nvme,
    release_groups_of_an_ended_world,
    use_deepspeed_hpu_accelerator,
)
from pytorch_lightning.plugins.precision.hpu import HPUPrecisionPlugin
from pytorch_lightning.plugins.precision.hpu_deepspeed import HPUDeepSpeedPrecisionPlugin
from pytorch_lightning.strategies._hpu import _HPUTrainerStrategyMixin


class HPUDeepSpeedStrategy(_HPUTrainerStrategyMixin, _HPUParallelDevicesMixin, DeepSpeedStrategy):
    """Upstream's ``DeepSpeedStrategy`` on HPUs: one process per HPU over HCCL, DeepSpeed's HPU accelerator.

    It takes every argument of :class:`~lightning.pytorch.strategies.DeepSpeedStrategy` (``stage``,
    ``offload_optimizer``, ``offload_parameters``, ``cpu_checkpointing``, ``config`` as a dict or a JSON path, the
    ``PL_DEEPSPEED_CONFIG_PATH`` variable, ...). By name it is ``strategy="hpu_deepspeed"`` or one of the ZeRO presets
    ``"hpu_deepspeed_stage_1"``, ``"_stage_2"``, ``"_stage_2_offload"``, ``"_stage_3"``, ``"_stage_3_offload"``; with
    ``accelerator="hpu"`` the CUDA names ``"deepspeed"``, ``"deepspeed_stage_2"``, ... mean the same.

    For ``validate``, ``test`` and ``predict`` it also takes the arguments of ``deepspeed.init_inference`` (``dtype``,
    ``tensor_parallel``, ``replace_with_kernel_inject``, ``injection_policy``, ...), as keyword arguments or as keys of
    ``config``, as lightning-habana's strategy did: the model then runs in DeepSpeed's inference engine.

    Offload goes to host memory only: DeepSpeed has no asynchronous I/O for HPUs, so NVMe offload is refused. When
    both the LightningModule and the DeepSpeed config define an optimizer, the LightningModule's is used (upstream
    takes the config's optimizer and scheduler then, and does not call ``configure_optimizers``); so is its
    learning-rate scheduler when both define one, as upstream's is when the config has no optimizer. Both are logged.
    """

    strategy_name = "hpu_deepspeed"

    def __init__(self, *args: Any, process_group_backend: Optional[str] = "hccl", **kwargs: Any) -> None:
        self.inference_kwargs = _inference_arguments(kwargs)
        super().__init__(*args, process_group_backend=process_group_backend, **kwargs)
        refuse_nvme(self.config, kwargs)
        self._linear_before_setup: Optional[Callable[..., Tensor]] = None

    @override
    def setup_environment(self) -> None:
        self._require_hpu_accelerator("DeepSpeedStrategy")
        # before any process group exists, so that the refusal leaves nothing to tear down
        plugin, module = self.precision_plugin, self.lightning_module
        fp8_inference = (
            plugin.fp8_inference(module) if isinstance(plugin, HPUPrecisionPlugin) and module is not None else None
        )
        if self.zero_stage_3 and fp8_inference is not None and not fp8_inference.measuring:
            raise MisconfigurationException(
                "ZeRO stage 3 partitions the model's parameters, which DeepSpeed cannot do with the fp8 weights of a"
                " quantized model. Run fp8 inference with ZeRO stage 0, 1 or 2 (e.g. `strategy='hpu_deepspeed'`)."
            )
        use_deepspeed_hpu_accelerator()
        self._linear_before_setup = torch.nn.functional.linear
        self._setup_hpu()
        # upstream's own level only refuses anything but CUDA, which this method checks for HPU first (pinned by
        # test_deepspeed_setup_environment_only_checks_for_cuda); the levels above it are the chain we need
        super(DeepSpeedStrategy, self).setup_environment()
        self._setup_sigterm_agreement()

    @override
    def setup_distributed(self) -> None:
        # importing it registers the "hccl" backend with torch.distributed; DeepSpeed never imports it
        import habana_frameworks.torch.distributed.hccl  # noqa: F401

        release_groups_of_an_ended_world()
        super().setup_distributed()

    @override
    def _format_config(self) -> None:
        super()._format_config()
        assert isinstance(self.config, dict)
        engine_in_bf16_for_fp8(self.config, self.precision_plugin.precision)

    @override
    def _initialize_deepspeed_train(self, model: Module) -> None:
        assert isinstance(self.config, dict)
        if "optimizer" in self.config and is_overridden("configure_optimizers", self.lightning_module):
            rank_zero_info(
                "The DeepSpeed config and `LightningModule.configure_optimizers` both define an optimizer: the"
                " LightningModule's is used (upstream's `DeepSpeedStrategy` would use the config's optimizer and"
                " scheduler, and not call `configure_optimizers`)."
            )
            self.config = {key: value for key, value in self.config.items() if key != "optimizer"}
        super()._initialize_deepspeed_train(model)

    @override
    def _init_optimizers(self) -> tuple[Any, Any]:
        optimizer, scheduler = super()._init_optimizers()
        # upstream goes on with a placeholder, and DeepSpeed fails deep inside on its empty parameter groups
        if isinstance(optimizer, _MockOptimizer):
            raise MisconfigurationException(
                "`HPUDeepSpeedStrategy` trains with the optimizer that `LightningModule.configure_optimizers` returns,"
                " and it returned None. Return an optimizer from `configure_optimizers`, or define one in the DeepSpeed"
                ' config (`"optimizer": {"type": "AdamW", "params": {...}}`).'
            )
        assert isinstance(self.config, dict)
        if scheduler is not None and "scheduler" in self.config:
            # DeepSpeed builds the config's scheduler only when it is given none
            rank_zero_info(
                "The DeepSpeed config and `LightningModule.configure_optimizers` both define a learning-rate scheduler:"
                " the LightningModule's is used, as DeepSpeed and upstream's `DeepSpeedStrategy` do when the config"
                " defines no optimizer."
            )
        return optimizer, scheduler

    @override
    def _auto_select_batch_size(self) -> int:
        # the batch size only labels DeepSpeed's throughput logs; upstream reads it from the training data even in
        # `test`/`validate`/`predict`, where a data module has not set its training data up
        if self.lightning_module.trainer.state.fn != TrainerFn.FITTING:  # type: ignore[union-attr]
            return 1
        return super()._auto_select_batch_size()

    @override
    def _initialize_deepspeed_inference(self, model: Module) -> None:
        # after `fit`, teardown left a ZeRO-3 model gathered on the host, where DeepSpeed no longer moves it from
        model.to(self.root_device)
        import deepspeed

        assert isinstance(self.config, dict)
        config = {key: value for key, value in self.config.items() if key in deepspeed.default_inference_config()}
        if not (self.inference_kwargs or config):
            super()._initialize_deepspeed_inference(model)
            return
        # DeepSpeed's inference engine (tensor parallelism, kernel injection), as lightning-habana's strategy built it
        self.model = deepspeed.init_inference(model, config=config, **self.inference_kwargs)
        # its weights are in its own dtype, whatever the precision: the precision plugin casts the inputs to it
        dtype = self.model._config.dtype
        if isinstance(self.precision_plugin, HPUDeepSpeedPrecisionPlugin) and dtype.is_floating_point:
            self.precision_plugin.inference_dtype = dtype

    @override
    def teardown(self) -> None:
        super().teardown()
        # ZeRO-3's memory-efficient linear replaces `torch.nn.functional.linear` for the whole process and DeepSpeed
        # leaves it there; its backward autocasts on the HPU, which breaks CPU autocast code run after `fit`
        if self._linear_before_setup is not None:
            torch.nn.functional.linear = self._linear_before_setup
            self._linear_before_setup = None

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        for suffix, arguments in PRESETS.items():
            strategy_registry.register(
                f"{cls.strategy_name}{suffix}",
                cls,
                description=f"DeepSpeed on HPUs {arguments or 'with its default ZeRO stage 2'}",
                **arguments,
            )


def _inference_arguments(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the arguments of ``deepspeed.init_inference`` out of ``kwargs``; any other argument upstream's strategy
    does not take is refused, naming both lists."""
    upstream = set(inspect.signature(DeepSpeedStrategy.__init__).parameters)
    extra = [name for name in kwargs if name not in upstream]
    if not extra:
        return {}
    import deepspeed

    inference = set(deepspeed.default_inference_config())
    unknown = sorted(name for name in extra if name not in inference)
    if unknown:
        raise TypeError(
            f"`HPUDeepSpeedStrategy` got unexpected arguments {unknown}: it takes those of `DeepSpeedStrategy` and, for"
            f" inference, those of `deepspeed.init_inference` ({', '.join(sorted(inference))})."
        )
    return {name: kwargs.pop(name) for name in extra}
