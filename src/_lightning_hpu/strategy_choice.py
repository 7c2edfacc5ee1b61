"""Which HPU strategy a set of flags asks for: the rules the Trainer's and Fabric's flag resolution share.

Each of them has its own registry, strategy classes and error type; :class:`StrategyChoice` holds those and applies
the same rules: when the flags involve an HPU, which strategy ``"auto"`` means, which HPU strategy an upstream
strategy name or instance becomes, and which combinations are refused before any work.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional, Union

# upstream's names of data-parallel strategies -> the HPU strategy that does the same over HCCL
CUDA_NAMES = {
    "ddp": "hpu_parallel",
    "ddp_spawn": "hpu_parallel_spawn",
    "fsdp": "hpu_fsdp",
    "fsdp_cpu_offload": "hpu_fsdp_cpu_offload",
    "model_parallel": "hpu_model_parallel",
}


@dataclass(frozen=True)
class StrategyChoice:
    """The HPU strategy rules for one entry point (``owner``: ``"Trainer"`` or ``"Fabric"``).

    Args:
        owner: the class users build, for messages.
        accelerator_class: the HPU accelerator class.
        registry: its strategy registry.
        strategy_base: the base class of its strategies.
        hpu_base: the class every HPU strategy of it derives from.
        single, parallel: the names of its one-device and data-parallel HPU strategies.
        error: the exception it raises for a misconfiguration.
        counterparts: upstream strategy class -> the HPU strategy class derived from it (see :func:`counterparts`).
        preset_name: the HPU strategy name for one of upstream's preset names (DeepSpeed's), or ``None``.
    """

    owner: str
    accelerator_class: type[Any]
    registry: Any
    strategy_base: type
    hpu_base: type
    single: str
    parallel: str
    error: type[Exception]
    counterparts: Mapping[type, type]
    preset_name: Callable[[str], Optional[str]]

    def convert(self, strategy: Any) -> Any:
        """An instance of an upstream strategy with an HPU counterpart (``DDPStrategy(find_unused_parameters=True)``,
        ``DeepSpeedStrategy(stage=3)``, ...) becomes that HPU strategy with the same settings; anything else is
        returned as it is."""
        hpu_class = self.counterparts.get(type(strategy))
        return strategy if hpu_class is None else hpu_class.from_upstream(strategy)

    def by_name(self, name: str) -> Any:
        """The HPU strategy for one of upstream's names of a strategy with an HPU counterpart: ``"ddp"`` is
        ``"hpu_parallel"``, ``"ddp_find_unused_parameters_true"`` that strategy with the option set,
        ``"deepspeed_stage_2"`` is ``"hpu_deepspeed_stage_2"``. Other names are returned as they are; names that fork
        the processes are refused, as HPU processes are started fresh."""
        preset = self.preset_name(name)
        if preset is not None:
            return preset
        if name in CUDA_NAMES or name not in self.registry:
            return CUDA_NAMES.get(name, name)
        entry = self.registry[name]
        if entry["strategy"] not in self.counterparts:
            return name
        if entry["init_params"].get("start_method") in ("fork", "forkserver"):
            raise self.error(
                f"`{self.owner}(strategy={name!r})` starts its processes by forking this one, which HPU strategies do"
                f" not do: each process loads the Gaudi software itself. Use `strategy='{CUDA_NAMES['ddp']}'` in a"
                f" script, or `'{CUDA_NAMES['ddp_spawn']}'` (whose functions must be importable), with the same"
                " options as a `DDPStrategy(...)` instance."
            )
        return self.convert(self.registry.get(name))

    def uses_hpu(self, accelerator: Any, strategy: Any) -> bool:
        """Whether these flags involve an HPU; an HPU strategy with another accelerator is refused."""
        if isinstance(accelerator, self.accelerator_class) or accelerator == "hpu":
            return True
        if self.is_hpu_strategy(strategy):
            if accelerator != "auto":
                raise self.error(
                    f"`{self.owner}(strategy={describe(strategy)})` runs on HPUs but"
                    f" `accelerator={describe(accelerator)}` was given. Use `accelerator='hpu'` (or 'auto'), or choose"
                    " a strategy for that accelerator."
                )
            return True
        # "auto" prefers a Gaudi, unless a strategy instance already carries another accelerator
        strategy_accelerator = strategy.accelerator if isinstance(strategy, self.strategy_base) else None
        return accelerator == "auto" and strategy_accelerator is None and self.accelerator_class.is_available()

    def is_hpu_strategy(self, strategy: Any) -> bool:
        if isinstance(strategy, self.strategy_base):
            return isinstance(strategy, self.hpu_base)
        if strategy in self.registry:
            return issubclass(self.registry[strategy]["strategy"], self.hpu_base)
        return isinstance(strategy, str) and strategy.startswith("hpu")

    def strategy_class(self, strategy: Any) -> type:
        """The class of a strategy instance, or the one registered under a strategy name."""
        return self.registry[strategy]["strategy"] if isinstance(strategy, str) else type(strategy)

    def is_single(self, strategy: Any) -> bool:
        strategy_class = self.registry[self.single]["strategy"]
        return isinstance(strategy, strategy_class) or strategy == self.single

    def devices(self, strategy: Any, devices: Any) -> int:
        """The number of HPUs per node: what the ``devices`` flag asks for, or the strategy's own devices when the
        count is left to us (one for the single-device strategy, its ``parallel_devices`` if it carries them)."""
        own = getattr(strategy, "parallel_devices", None) if isinstance(strategy, self.strategy_base) else None
        if own:
            if devices != "auto" and self.accelerator_class.parse_devices(devices) != len(own):
                raise self.error(
                    f"`{self.owner}(devices={devices!r})` asks for another number of HPUs than the"
                    f" {len(own)} `parallel_devices` of `strategy={describe(strategy)}`. Pass one of them only."
                )
            return len(own)
        if self.is_single(strategy) and devices == "auto":
            return 1
        return self.accelerator_class.parse_devices(devices)

    def accelerator(self, accelerator: Any, strategy: Any) -> Any:
        """The accelerator flag for upstream's connector: ``"auto"`` when the strategy instance carries the HPU
        accelerator (upstream takes it from there and refuses it given twice), else an ``HPUAccelerator``."""
        carried = vars(strategy).get("_accelerator") if isinstance(strategy, self.strategy_base) else None
        if isinstance(carried, self.accelerator_class):
            return "auto"
        if carried is not None:
            raise self.error(
                f"`{self.owner}(accelerator={describe(accelerator)}, strategy={describe(strategy)})`: the strategy"
                f" carries `{type(carried).__name__}`, which does not drive HPUs. Give the strategy no accelerator,"
                " or `HPUAccelerator()`."
            )
        return accelerator if isinstance(accelerator, self.accelerator_class) else self.accelerator_class()

    def choose(self, strategy: Any, devices: int, num_nodes: int, chosen_by_auto: bool) -> Union[str, Any]:
        """The HPU strategy for ``strategy`` (a name or an instance; ``"auto"`` picks by the number of processes)."""
        distributed = devices > 1 or num_nodes > 1
        if strategy == "auto":
            return self.parallel if distributed else self.single
        if not self.is_hpu_strategy(strategy) or (isinstance(strategy, str) and strategy not in self.registry):
            names = sorted(name for name in self.registry if self.is_hpu_strategy(name))
            accelerator = "'auto'` (which picks the Gaudi on this machine)" if chosen_by_auto else "'hpu'`"
            raise self.error(
                f"`{self.owner}(strategy={describe(strategy)})` is not supported with `accelerator={accelerator}: HPUs"
                f" run with an HPU strategy. Choose one of {', '.join(names)}, or leave `strategy='auto'`"
                + (", or set `accelerator='cpu'`." if chosen_by_auto else ".")
            )
        if self.is_single(strategy) and distributed:
            raise self.error(
                f"`strategy={describe(strategy)}` runs on one HPU but `devices={devices}, num_nodes={num_nodes}` asks"
                f" for more. Use `strategy='{self.parallel}'`, or `devices=1`."
            )
        return strategy


def counterparts(*hpu_classes: type) -> dict[type, type]:
    """Upstream strategy class -> the HPU strategy class derived from it: its last base, the mixins come first."""
    return {hpu_class.__bases__[-1]: hpu_class for hpu_class in hpu_classes}


def describe(flag: Any) -> str:
    return repr(flag) if isinstance(flag, str) else f"{type(flag).__name__}()"
