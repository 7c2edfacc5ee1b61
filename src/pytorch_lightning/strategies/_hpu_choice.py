"""Which HPU strategy a set of flags asks for: the rules the Trainer's and Fabric's flag resolution share.

Each of them has its own registry, strategy classes and error type; :class:`StrategyChoice` holds those and applies
the same rules: when the flags involve an HPU, which strategy ``"auto"`` means, and which combinations are refused
before any work.
"""

from collections.abc import Iterable
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
    """

    owner: str
    registry: Any
    strategy_base: type
    hpu_base: type
    single: str
    parallel: str
    error: type[Exception]

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


def as_list(plugins: Any) -> list[Any]:
    if plugins is None:
        return []
    if isinstance(plugins, Iterable) and not isinstance(plugins, (str, dict)):
        return list(plugins)
    return [plugins]


def describe(flag: Any) -> str:
    return repr(flag) if isinstance(flag, str) else f"{type(flag).__name__}()"
