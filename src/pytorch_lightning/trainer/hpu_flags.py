"""Turn the Trainer's HPU flags into objects upstream's accelerator connector accepts.

Upstream Lightning 2.6 refuses ``accelerator="hpu"``, never picks HPU for ``"auto"`` and maps mixed precision to CUDA.
It does accept instances: an accelerator, a registered strategy name or instance, and a ``Precision`` in ``plugins``.
This is the one place where HPU flags become those objects, and where HPU misconfigurations fail, before any work.
"""

import os
from typing import Any, Optional, Union

from lightning.fabric.plugins.environments import (
    ClusterEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from lightning.pytorch.plugins import MixedPrecisionPlugin
from lightning.pytorch.plugins.precision import DeepSpeedPrecision, FSDPPrecision, MixedPrecision, Precision
from lightning.pytorch.strategies import Strategy, StrategyRegistry
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from pytorch_lightning.accelerators.hpu import HPUAccelerator
from pytorch_lightning.plugins.precision.hpu import HPUPrecisionPlugin
from pytorch_lightning.plugins.precision.hpu_deepspeed import HPUDeepSpeedPrecisionPlugin
from pytorch_lightning.plugins.precision.hpu_fsdp import HPUFSDPPrecision
from pytorch_lightning.profilers.hpu import HPUProfiler
from pytorch_lightning.strategies._hpu import _HPUTrainerStrategyMixin
from pytorch_lightning.strategies._hpu_choice import (
    StrategyChoice,
    as_list,
    counterparts,
    first_devices,
    refuse_another_precision_flag,
)
from pytorch_lightning.strategies.hpu_deepspeed import HPUDeepSpeedStrategy, hpu_name_of
from pytorch_lightning.strategies.hpu_fsdp import HPUFSDPStrategy
from pytorch_lightning.strategies.hpu_model_parallel import HPUModelParallelStrategy
from pytorch_lightning.strategies.hpu_parallel import HPUParallelStrategy
from pytorch_lightning.strategies.single_hpu import SingleHPUStrategy

# the HPU strategy rules, with the Trainer's registry and classes
_CHOICE = StrategyChoice(
    owner="Trainer",
    registry=StrategyRegistry,
    strategy_base=Strategy,
    hpu_base=_HPUTrainerStrategyMixin,
    single=SingleHPUStrategy.strategy_name,
    parallel=HPUParallelStrategy.strategy_name,
    error=MisconfigurationException,
    counterparts=counterparts(
        SingleHPUStrategy, HPUParallelStrategy, HPUDeepSpeedStrategy, HPUFSDPStrategy, HPUModelParallelStrategy
    ),
)


def resolve_hpu_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """Return the connector's arguments (``accelerator``, ``strategy``, ``devices``, ``num_nodes``, ``precision``,
    ``plugins``) with HPU flags resolved; arguments that do not involve HPU come back unchanged."""
    accelerator, strategy = _lower(flags["accelerator"]), _lower(flags["strategy"])
    if not _CHOICE.uses_hpu(accelerator, strategy):
        return flags
    # a script moved from CUDA keeps its data-parallel and DeepSpeed strategy names and instances
    if isinstance(strategy, str):
        strategy = hpu_name_of(strategy) or _CHOICE.by_name(strategy)
    else:
        strategy = _CHOICE.convert(strategy)

    if not HPUAccelerator.is_available():
        raise MisconfigurationException(
            "`Trainer(accelerator='hpu')` was requested but no Intel Gaudi is available: the `habana_frameworks`"
            " package is not installed or sees no device. Install the Intel Gaudi software stack, or set"
            " `VIRTUAL_HPU=1` to train on the virtual Gaudi."
        )
    num_nodes = flags["num_nodes"]
    devices = _CHOICE.devices(strategy, first_devices(flags["devices"], "Trainer", MisconfigurationException))
    plugins = as_list(flags["plugins"])
    hpu_strategy = _CHOICE.choose(strategy, devices, num_nodes, chosen_by_auto=accelerator == "auto")
    # upstream reports a `num_nodes` that is not a positive int
    if isinstance(num_nodes, int) and num_nodes > 0 and not _cluster_is_managed(strategy, plugins):
        _validate_world_size(num_nodes, devices)
        _validate_rendezvous(num_nodes)
    family = _precision_family(hpu_strategy)
    return {
        **flags,
        "accelerator": _CHOICE.accelerator(accelerator, hpu_strategy),
        "devices": devices,
        "strategy": hpu_strategy,
        **_hpu_precision(flags["precision"], plugins, family, _strategy_precision(hpu_strategy, family)),
    }


def _lower(flag: Any) -> Any:
    return flag.lower() if isinstance(flag, str) else flag


def resolve_profiler(profiler: Any) -> Any:
    """``profiler="hpu"``, which upstream's fixed list of profiler names lacks, becomes an ``HPUProfiler``."""
    if isinstance(profiler, str) and profiler.lower() == "hpu":
        return HPUProfiler()
    return profiler


def _strategy_precision(strategy: Union[str, Strategy], family: type[Precision]) -> Optional[Precision]:
    """The precision plugin a strategy instance carries (``SingleHPUStrategy(precision_plugin=...)``), made the HPU
    plugin of its family in place, as upstream's connector later sets its own on the strategy."""
    plugin = getattr(strategy, "_precision_plugin", None)
    if plugin is None:
        return None
    strategy.precision_plugin = _as_hpu_plugin(plugin, family)  # type: ignore[union-attr]
    return strategy.precision_plugin  # type: ignore[union-attr]


def _cluster_is_managed(strategy: Union[str, Strategy], plugins: list[Any]) -> bool:
    """Whether a cluster environment, given or detected as upstream does, supplies the rendezvous and the ranks."""
    if any(isinstance(plugin, ClusterEnvironment) for plugin in plugins):
        return True
    if isinstance(strategy, Strategy) and getattr(strategy, "cluster_environment", None) is not None:
        return True
    return any(env.detect() for env in (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment, MPIEnvironment))


def _validate_world_size(num_nodes: int, devices: int) -> None:
    """``WORLD_SIZE`` set by hand must match the run, or each node trains a separate job.

    Lightning's launcher sets it in the processes it starts, together with ``LOCAL_RANK``; those are left alone.
    """
    world_size = os.environ.get("WORLD_SIZE")
    if world_size is None or "LOCAL_RANK" in os.environ or world_size.strip() == str(num_nodes * devices):
        return
    raise MisconfigurationException(
        f"`Trainer(num_nodes={num_nodes}, devices={devices})` starts {num_nodes * devices} processes but"
        f" `WORLD_SIZE={world_size}` is set. Pass `num_nodes` (the number of nodes) and `devices` (HPUs per node)"
        " so that `num_nodes * devices == WORLD_SIZE`, or unset `WORLD_SIZE`."
    )


def _validate_rendezvous(num_nodes: int) -> None:
    """Nodes meet at ``MASTER_ADDR:MASTER_PORT`` as ``NODE_RANK``; without them each node waits for the others until
    the process-group timeout."""
    if num_nodes == 1:
        return
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name, "").strip()]
    if "NODE_RANK" not in os.environ and "GROUP_RANK" not in os.environ:
        missing.append("NODE_RANK")
    if missing:
        raise MisconfigurationException(
            f"`Trainer(num_nodes={num_nodes})` needs {', '.join(missing)} in the environment of every node, and none"
            " of SLURM, torchrun, LSF or MPI was detected to provide them. Set `MASTER_ADDR` to the address of node 0,"
            " `MASTER_PORT` to a free port (the same on all nodes) and `NODE_RANK` to 0, 1, ... per node."
        )
    port = os.environ["MASTER_PORT"].strip()
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise MisconfigurationException(f"`MASTER_PORT={port}` is not a port number. Set a free port in 1-65535.")
    node_rank = os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "")).strip()
    if not node_rank.isdigit() or int(node_rank) >= num_nodes:
        raise MisconfigurationException(
            f"`NODE_RANK={node_rank}` is not a node of `Trainer(num_nodes={num_nodes})`. Set it to a number from 0 to"
            f" {num_nodes - 1}, a different one per node, 0 on the node at `MASTER_ADDR`."
        )


def _hpu_precision(
    precision: Optional[Union[str, int]], plugins: list[Any], family: type[Precision], on_strategy: Optional[Precision]
) -> dict[str, Any]:
    """The HPU precision plugin of the strategy's family (DeepSpeed's leaves backward and the step to its engine,
    FSDP's sets the dtypes of the shards), unless the strategy carries one (``on_strategy``)."""
    precision_plugins = [plugin for plugin in plugins if isinstance(plugin, Precision)]
    if on_strategy is not None:
        # upstream reports a plugin given both ways; a flag would be ignored
        refuse_another_precision_flag(precision, on_strategy, "Trainer", MisconfigurationException)
        return {"precision": None, "plugins": plugins}
    if not precision_plugins:
        plugin = family("32-true" if precision is None else precision)  # type: ignore[call-arg]
        return {"precision": None, "plugins": [*plugins, plugin]}
    # upstream reports a precision flag given together with a precision plugin
    given = precision_plugins[0]
    ours = _as_hpu_plugin(given, family)
    return {"precision": precision, "plugins": [ours if plugin is given else plugin for plugin in plugins]}


# the precision plugins of the strategies whose own plugins are not the general HPU ones
_SPECIAL_FAMILIES = (HPUDeepSpeedPrecisionPlugin, HPUFSDPPrecision)
# upstream's plugins that ours replace, as the examples of earlier releases and CUDA scripts pass them
_UPSTREAM_EQUIVALENTS = {HPUDeepSpeedPrecisionPlugin: DeepSpeedPrecision, HPUFSDPPrecision: FSDPPrecision}


def _precision_family(strategy: Union[str, Strategy]) -> type[Precision]:
    strategy_class = StrategyRegistry[strategy]["strategy"] if isinstance(strategy, str) else type(strategy)
    if issubclass(strategy_class, HPUDeepSpeedStrategy):
        return HPUDeepSpeedPrecisionPlugin
    if issubclass(strategy_class, HPUFSDPStrategy):
        return HPUFSDPPrecision
    return HPUPrecisionPlugin


def _as_hpu_plugin(plugin: Precision, family: type[Precision]) -> Precision:
    """The HPU plugin for a precision plugin passed in ``plugins``; upstream's own ones where they mean the same."""
    if type(plugin) is _UPSTREAM_EQUIVALENTS.get(family):
        return family(plugin.precision)  # type: ignore[call-arg]
    if (
        family is HPUPrecisionPlugin
        and type(plugin) in (MixedPrecision, MixedPrecisionPlugin)
        and plugin.device == "hpu"
    ):
        # lightning-habana accepted upstream's autocast plugin for the HPU (also by its 1.x name, as Intel's reference
        # models pass it); ours autocasts the same way and adds Gaudi's rules (op lists, fp16 only from Gaudi2 on)
        return HPUPrecisionPlugin(plugin.precision)
    if type(plugin) is Precision:
        # the same fp32, with what every HPU plugin does at the end of a run
        return family()
    special = isinstance(plugin, _SPECIAL_FAMILIES)
    if isinstance(plugin, family) and (family in _SPECIAL_FAMILIES or not special):
        return plugin
    strategies = {HPUDeepSpeedPrecisionPlugin: " with DeepSpeed", HPUFSDPPrecision: " with FSDP"}
    raise MisconfigurationException(
        f"`plugins=[{type(plugin).__name__}(...)]` does not run on HPU{strategies.get(family, '')}"
        + (" without its strategy" if special and family is HPUPrecisionPlugin else "")
        + f". Pass `{family.__name__}(precision=...)` instead, or use the `precision` flag."
    )
