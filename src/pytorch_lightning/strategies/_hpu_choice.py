"""Which HPU strategy a set of flags asks for: the rules the Trainer's and Fabric's flag resolution share.

Each of them has its own registry, strategy classes and error type; :class:`StrategyChoice` holds those and applies
the same rules: when the flags involve an HPU, which strategy ``"auto"`` means, which HPU strategy an upstream
strategy instance becomes, and which combinations are refused before any work.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Union

from pytorch_lightning.accelerators.hpu import HPUAccelerator

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
        registry: its strategy registry.
        strategy_base: the base class of its strategies.
        hpu_base: the class every HPU strategy of it derives from.
        single, parallel: the names of its one-device and data-parallel HPU strategies.
        error: the exception it raises for a misconfiguration.
        counterparts: upstream strategy class -> the HPU strategy class derived from it (see :func:`counterparts`).
    """

    owner: str
    registry: Any
    strategy_base: type
    hpu_base: type
    single: str
    parallel: str
    error: type[Exception]
    counterparts: Mapping[type, type]

    def convert(self, strategy: Any) -> Any:
        """An instance of an upstream strategy with an HPU counterpart (``DDPStrategy(find_unused_parameters=True)``,
        ``DeepSpeedStrategy(stage=3)``, ...) becomes that HPU strategy with the same settings; anything else is
        returned as it is."""
        hpu_class = self.counterparts.get(type(strategy))
        return strategy if hpu_class is None else hpu_class.from_upstream(strategy)

    def by_name(self, name: str) -> Any:
        """The HPU strategy for one of upstream's names of a strategy with an HPU counterpart: ``"ddp"`` is
        ``"hpu_parallel"``, ``"ddp_find_unused_parameters_true"`` that strategy with the option set. Other names are
        returned as they are; names that fork the processes are refused, as HPU processes are started fresh."""
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
        if isinstance(accelerator, HPUAccelerator) or accelerator == "hpu":
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
        return accelerator == "auto" and strategy_accelerator is None and HPUAccelerator.is_available()

    def is_hpu_strategy(self, strategy: Any) -> bool:
        if isinstance(strategy, self.strategy_base):
            return isinstance(strategy, self.hpu_base)
        if strategy in self.registry:
            return issubclass(self.registry[strategy]["strategy"], self.hpu_base)
        return isinstance(strategy, str) and strategy.startswith("hpu")

    def is_single(self, strategy: Any) -> bool:
        strategy_class = self.registry[self.single]["strategy"]
        return isinstance(strategy, strategy_class) or strategy == self.single

    def devices(self, strategy: Any, devices: Any) -> int:
        """The number of HPUs per node: what the ``devices`` flag asks for, or the strategy's own devices when the
        count is left to us (one for the single-device strategy, its ``parallel_devices`` if it carries them)."""
        own = getattr(strategy, "parallel_devices", None) if isinstance(strategy, self.strategy_base) else None
        if own:
            if devices != "auto" and HPUAccelerator.parse_devices(devices) != len(own):
                raise self.error(
                    f"`{self.owner}(devices={devices!r})` asks for another number of HPUs than the"
                    f" {len(own)} `parallel_devices` of `strategy={describe(strategy)}`. Pass one of them only."
                )
            return len(own)
        if self.is_single(strategy) and devices == "auto":
            return 1
        return HPUAccelerator.parse_devices(devices)

    def accelerator(self, accelerator: Any, strategy: Any) -> Any:
        """The accelerator flag for upstream's connector: ``"auto"`` when the strategy instance carries the HPU
        accelerator (upstream takes it from there and refuses it given twice), else an ``HPUAccelerator``."""
        carried = vars(strategy).get("_accelerator") if isinstance(strategy, self.strategy_base) else None
        if isinstance(carried, HPUAccelerator):
            return "auto"
        if carried is not None:
            raise self.error(
                f"`{self.owner}(accelerator={describe(accelerator)}, strategy={describe(strategy)})`: the strategy"
                f" carries `{type(carried).__name__}`, which does not drive HPUs. Give the strategy no accelerator,"
                " or `HPUAccelerator()`."
            )
        return accelerator if isinstance(accelerator, HPUAccelerator) else HPUAccelerator()

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


def first_devices(devices: Any, owner: str, error: type[Exception]) -> Any:
    """``devices=[0, 1, ..., n-1]``, what CUDA scripts write for "the first n devices", as the count ``n``.

    A process owns a whole Gaudi card, picked by its local rank, so other lists cannot be honoured and are refused.
    The string form (``"0,1"``) counts as a list.
    """
    indices = devices.split(",") if isinstance(devices, str) and "," in devices else None
    if indices is not None and all(index.strip().isdigit() for index in indices):
        devices = [int(index) for index in indices]
    if not isinstance(devices, (list, tuple)):
        return devices
    if list(devices) == list(range(len(devices))) and devices:
        from lightning.fabric.utilities.rank_zero import rank_zero_info

        rank_zero_info(f"`{owner}(devices={list(devices)})` on HPUs: using the first {len(devices)} HPUs.")
        return len(devices)
    raise error(
        f"`{owner}(accelerator='hpu', devices={list(devices)})` cannot be honoured: each process uses the HPU of its"
        f" local rank, so only the first n HPUs can be chosen. Pass `devices={len(devices) or 1}` (the first"
        f" {len(devices) or 1}), or choose the cards with `HABANA_VISIBLE_MODULES`."
    )


def refuse_another_precision_flag(precision: Any, plugin: Any, owner: str, error: type[Exception]) -> None:
    """A precision flag next to the strategy's own precision plugin must say the same; upstream would ignore it."""
    from lightning.fabric.connector import _convert_precision_to_unified_args

    if precision is None:
        return
    try:
        unified = _convert_precision_to_unified_args(precision)
    except ValueError:  # Gaudi's own flags ("fp8")
        unified = str(precision)
    if unified == plugin.precision:
        return
    raise error(
        f"`{owner}(precision={precision!r})` conflicts with the strategy's `{type(plugin).__name__}` in"
        f" {plugin.precision!r}. Set the precision in one place only."
    )


def as_list(plugins: Any) -> list[Any]:
    if plugins is None:
        return []
    if isinstance(plugins, Iterable) and not isinstance(plugins, (str, dict)):
        return list(plugins)
    return [plugins]


def describe(flag: Any) -> str:
    return repr(flag) if isinstance(flag, str) else f"{type(flag).__name__}()"
