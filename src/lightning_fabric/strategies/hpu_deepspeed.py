"""DeepSpeed (ZeRO sharding, offload, activation checkpointing) for Fabric on Intel Gaudi."""

import sys
from typing import Any, Optional

import torch
from lightning.fabric.strategies import DeepSpeedStrategy, _StrategyRegistry
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from lightning_fabric.strategies._hpu import _HPUParallelDevicesMixin, _HPUStrategyMixin

# (name suffix, arguments) of the ZeRO presets, as upstream registers them for CUDA without the NVMe one
PRESETS: dict[str, dict[str, Any]] = {
    "": {},
    "_stage_1": {"stage": 1},
    "_stage_2": {"stage": 2},
    "_stage_2_offload": {"stage": 2, "offload_optimizer": True},
    "_stage_3": {"stage": 3},
    "_stage_3_offload": {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
}


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

        release_groups_of_an_ended_world()
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


def hpu_name_of(name: str) -> Optional[str]:
    """The HPU strategy name for one of upstream's DeepSpeed names (``"deepspeed_stage_2"``), or ``None``.

    Raises for the NVMe presets, before any work."""
    if name.startswith(("deepspeed", HPUDeepSpeedStrategy.strategy_name)) and name.endswith("_nvme"):
        _raise_nvme(f"strategy={name!r}")
    if not name.startswith("deepspeed"):
        return None
    suffix = name[len("deepspeed") :]
    return f"{HPUDeepSpeedStrategy.strategy_name}{suffix}" if suffix in PRESETS else None


def engine_in_bf16_for_fp8(config: dict[str, Any], precision: str) -> None:
    """Under fp8 DeepSpeed's engine trains in bf16 (upstream's config formatting knows no "fp8")."""
    if precision == "fp8" and "bf16" not in config:
        rank_zero_info("fp8: DeepSpeed's engine holds the model in bf16, Transformer Engine modules compute in fp8")
        config["bf16"] = {"enabled": True}


def use_deepspeed_hpu_accelerator() -> None:
    """DeepSpeed picks its accelerator once, when first imported; if that happened before ``habana_frameworks`` was
    importable it chose the CPU, and every engine would then place its buffers there."""
    from deepspeed.accelerator import get_accelerator, set_accelerator

    if get_accelerator().device_name() != "hpu":
        from deepspeed.accelerator.hpu_accelerator import HPU_Accelerator

        set_accelerator(HPU_Accelerator())


def release_groups_of_an_ended_world() -> None:
    """Before a new process group is set up: drop the groups DeepSpeed keeps from the last one, if it has ended.

    DeepSpeed keeps the groups it derives (a clone of the world group, the data-parallel group, ...) in module globals.
    Once the world they belong to is destroyed, the next engine would use them and fail ("Group ... is not
    registered"). Upstream DeepSpeed releases them in its own ``destroy_process_group`` only, not after torch's (which
    the Trainer's message advises); Intel's fork (Gaudi 1.20, 1.21) never does.
    """
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is None or torch.distributed.is_initialized():
        return
    release = getattr(groups, "_release_process_group_references", None)
    if release is not None:
        release(None)  # None: the whole world
        return
    # Intel's fork, which has no such function: the groups it derives from the world
    groups._WORLD_GROUP = None
    groups._DATA_PARALLEL_GROUP = None
    groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None


def refuse_nvme(config: Optional[dict[str, Any]], arguments: dict[str, Any]) -> None:
    if arguments.get("remote_device") == "nvme":
        _raise_nvme("remote_device='nvme'")
    for argument in ("offload_params_device", "offload_optimizer_device"):
        if arguments.get(argument) == "nvme" and (
            arguments.get("offload_parameters" if argument == "offload_params_device" else "offload_optimizer")
        ):
            _raise_nvme(f"{argument}='nvme'")
    zero = (config or {}).get("zero_optimization") or {}
    for section in ("offload_param", "offload_optimizer"):
        if (zero.get(section) or {}).get("device") == "nvme":
            _raise_nvme(f'a DeepSpeed config with "zero_optimization": {{"{section}": {{"device": "nvme"}}}}')


def _raise_nvme(what: str) -> None:
    raise MisconfigurationException(
        f"`{what}` offloads to NVMe, which DeepSpeed cannot do on HPUs (it has no asynchronous I/O for Gaudi)."
        " Offload to host memory instead: `offload_optimizer=True`, `offload_parameters=True` with the device 'cpu'"
        ' (the \'_offload\' presets), or `"device": "cpu"` in the config.'
    )
