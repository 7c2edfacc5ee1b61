"""Turn Fabric's HPU flags into objects upstream's connector accepts.

Upstream's Fabric accepts an accelerator instance, a registered strategy name and a ``Precision`` in ``plugins``, but
never picks HPU for ``"auto"``, maps ``"ddp"``/``"deepspeed"`` to its CUDA/CPU strategies and its precision flags to
CUDA's plugins. ``_lightning_hpu.connector.HPUConnector`` calls :func:`resolve_hpu_flags` before upstream's connector
runs; HPU misconfigurations fail here, before any work.
"""

from typing import Any, Optional, Union

from lightning.fabric.plugins.precision import DeepSpeedPrecision, FSDPPrecision, MixedPrecision, Precision
from lightning.fabric.strategies import STRATEGY_REGISTRY, Strategy

from lightning_fabric.plugins.precision import HPUDeepSpeedPrecision, HPUFSDPPrecision, HPUPrecision
from lightning_fabric.plugins.precision.hpu import FabricHooks
from lightning_fabric.strategies import (
    HPUDeepSpeedStrategy,
    HPUFSDPStrategy,
    HPUModelParallelStrategy,
    HPUParallelStrategy,
    SingleHPUStrategy,
)
from pytorch_lightning.accelerators.hpu import HPUAccelerator
from pytorch_lightning.strategies._hpu import _HPUStrategyMixin
from pytorch_lightning.strategies._hpu_choice import (
    StrategyChoice,
    as_list,
    counterparts,
    first_devices,
    refuse_another_precision_flag,
)
from pytorch_lightning.strategies.hpu_deepspeed import hpu_name_of

# the HPU strategy rules, with Fabric's registry and classes
_CHOICE = StrategyChoice(
    owner="Fabric",
    registry=STRATEGY_REGISTRY,
    strategy_base=Strategy,
    hpu_base=_HPUStrategyMixin,
    single=SingleHPUStrategy.strategy_name,
    parallel=HPUParallelStrategy.strategy_name,
    error=ValueError,
    counterparts=counterparts(
        SingleHPUStrategy, HPUParallelStrategy, HPUDeepSpeedStrategy, HPUFSDPStrategy, HPUModelParallelStrategy
    ),
)
# Fabric's fp8 flag on CUDA (NVIDIA's Transformer Engine) is fp8 with Gaudi's
_CUDA_PRECISIONS = {"transformer-engine": "fp8"}


def resolve_hpu_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """Return Fabric's arguments with HPU flags resolved; arguments that do not involve HPU come back unchanged."""
    accelerator, strategy = _lower(flags["accelerator"]), _lower(flags["strategy"])
    if not _CHOICE.uses_hpu(accelerator, strategy):
        return flags
    if isinstance(strategy, str):
        strategy = hpu_name_of(strategy) or _CHOICE.by_name(strategy)
    else:
        strategy = _CHOICE.convert(strategy)
    if not HPUAccelerator.is_available():
        raise RuntimeError(
            "`Fabric(accelerator='hpu')` was requested but no Intel Gaudi is available: the `habana_frameworks`"
            " package is not installed or sees no device. Install the Intel Gaudi software stack, or set"
            " `VIRTUAL_HPU=1` to run on the virtual Gaudi."
        )
    devices = _CHOICE.devices(strategy, first_devices(flags["devices"], "Fabric", ValueError))
    hpu_strategy = _CHOICE.choose(strategy, devices, flags["num_nodes"], chosen_by_auto=accelerator == "auto")
    precision = flags["precision"]
    if isinstance(precision, str):
        precision = _CUDA_PRECISIONS.get(precision, precision)
    family = _precision_family(hpu_strategy)
    return {
        **flags,
        "accelerator": _CHOICE.accelerator(accelerator, hpu_strategy),
        "devices": devices,
        "strategy": hpu_strategy,
        **_hpu_precision(precision, as_list(flags["plugins"]), family, _strategy_precision(hpu_strategy, family)),
    }


def _lower(flag: Any) -> Any:
    return flag.lower() if isinstance(flag, str) else flag


# the precision plugins of the strategies whose own plugins are not the general HPU ones, and upstream's equivalents
_FAMILIES = {HPUDeepSpeedStrategy: HPUDeepSpeedPrecision, HPUFSDPStrategy: HPUFSDPPrecision}
_UPSTREAM_EQUIVALENTS = {HPUDeepSpeedPrecision: DeepSpeedPrecision, HPUFSDPPrecision: FSDPPrecision}


def _precision_family(strategy: Union[str, Strategy]) -> type[Precision]:
    strategy_class = STRATEGY_REGISTRY[strategy]["strategy"] if isinstance(strategy, str) else type(strategy)
    return next((family for owner, family in _FAMILIES.items() if issubclass(strategy_class, owner)), HPUPrecision)


def _strategy_precision(strategy: Union[str, Strategy], family: type[Precision]) -> Optional[Precision]:
    """The precision plugin a strategy instance carries (``SingleHPUStrategy(precision=...)``), made the HPU plugin of
    its family in place, as upstream's connector later sets its own on the strategy."""
    plugin = getattr(strategy, "_precision", None)
    if plugin is None:
        return None
    strategy.precision = _as_hpu_plugin(plugin, family)  # type: ignore[union-attr]
    return strategy.precision  # type: ignore[union-attr]


def _hpu_precision(
    precision: Any, plugins: list[Any], family: type[Precision], on_strategy: Optional[Precision]
) -> dict[str, Any]:
    """The HPU precision plugin of the strategy's family (DeepSpeed's leaves backward and the step to its engine,
    FSDP's sets the dtypes of the shards), unless the strategy carries one (``on_strategy``)."""
    precision_plugins = [plugin for plugin in plugins if isinstance(plugin, Precision)]
    if on_strategy is not None:
        # upstream reports a plugin given both ways; a flag would be ignored
        refuse_another_precision_flag(precision, on_strategy, "Fabric", ValueError)
        return {"precision": None, "plugins": plugins}
    if not precision_plugins:
        plugin = family("32-true" if precision is None else precision)
        return {"precision": None, "plugins": [*plugins, plugin]}
    # upstream reports a precision flag given together with a precision plugin
    given = precision_plugins[0]
    ours = _as_hpu_plugin(given, family)
    return {"precision": precision, "plugins": [ours if plugin is given else plugin for plugin in plugins]}


def _as_hpu_plugin(plugin: Precision, family: type[Precision]) -> Precision:
    """The HPU plugin for a precision plugin passed in ``plugins``; upstream's own ones where they mean the same."""
    special = tuple(_FAMILIES.values())
    if isinstance(plugin, FabricHooks) and (
        isinstance(plugin, family) if family in special else not isinstance(plugin, special)
    ):
        return plugin
    if type(plugin) in (Precision, _UPSTREAM_EQUIVALENTS.get(family)):
        return family(plugin.precision)  # type: ignore[call-arg]
    if family is HPUPrecision and type(plugin) is MixedPrecision and plugin.device == "hpu":
        # upstream's autocast plugin for the HPU, as lightning-habana accepted it
        return family(plugin.precision)  # type: ignore[call-arg]
    strategies = {HPUDeepSpeedPrecision: " with DeepSpeed", HPUFSDPPrecision: " with FSDP"}
    raise ValueError(
        f"`plugins=[{type(plugin).__name__}(...)]` does not run on HPU{strategies.get(family, '')}."
        f" Pass `{family.__name__}(precision=...)` instead, or use the `precision` flag."
    )
