"""Turn the HPU flags of the Trainer or of Fabric into objects upstream's connectors accept: the one resolver both use.

Upstream Lightning 2.6 refuses ``accelerator="hpu"``, never picks HPU for ``"auto"``, maps ``"ddp"``/``"deepspeed"``
to its CUDA/CPU strategies and its precision flags to CUDA's plugins. It does accept instances: an accelerator, a
registered strategy name or instance, and a ``Precision`` in ``plugins``. :class:`HPUFlags` turns the flags into
those, with the classes of one entry point (``pytorch_lightning.trainer.hpu_flags``, ``lightning_fabric.hpu_flags``),
and HPU misconfigurations fail there, before any work. It imports neither entry point's package: each gives its classes
as data.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from _lightning_hpu.precision_choice import PrecisionChoice
from _lightning_hpu.strategy_choice import StrategyChoice


@dataclass(frozen=True)
class HPUFlags:
    """The HPU flag resolution of one entry point, built once by it from its strategy and precision rules.

    Args:
        strategies: its strategy rules (which carry its name and error type).
        precisions: its precision rules.
        unavailable: the exception it raises when HPUs are asked for and no Gaudi is present.
        work: what it does on the virtual Gaudi (``"train"``), for that message.
        precision_aliases: its precision flags of other devices that mean one of Gaudi's.
        check_nodes: what it checks of ``(num_nodes, devices, strategy, plugins)`` before any process starts.
        cluster_environment: the environment it adds for ``(plugins, strategy)`` when a launcher upstream does not
            detect started the process (``None``: none), checked against the run at once.
    """

    strategies: StrategyChoice
    precisions: PrecisionChoice
    unavailable: type[Exception]
    work: str
    precision_aliases: Mapping[str, str] = field(default_factory=dict)
    check_nodes: Optional[Callable[[Any, int, Any, list[Any]], None]] = None
    cluster_environment: Optional[Callable[[list[Any], Any], Any]] = None

    def resolve(self, flags: dict[str, Any]) -> dict[str, Any]:
        """Return the connector's arguments (``accelerator``, ``strategy``, ``devices``, ``num_nodes``,
        ``precision``, ``plugins``) with HPU flags resolved; arguments that do not involve HPU come back unchanged."""
        choice = self.strategies
        accelerator, strategy = _lower(flags["accelerator"]), _lower(flags["strategy"])
        if not choice.uses_hpu(accelerator, strategy):
            return flags
        # a script moved from CUDA keeps its data-parallel and DeepSpeed strategy names and instances
        strategy = choice.by_name(strategy) if isinstance(strategy, str) else choice.convert(strategy)
        if not choice.accelerator_class.is_available():
            raise self.unavailable(
                f"`{choice.owner}(accelerator='hpu')` was requested but no Intel Gaudi is available: the"
                " `habana_frameworks` package is not installed or sees no device. Install the Intel Gaudi software"
                f" stack, or set `VIRTUAL_HPU=1` to {self.work} on the virtual Gaudi."
            )
        devices = choice.devices(strategy, _first_devices(flags["devices"], choice.owner, choice.error))
        plugins = self._with_cluster_environment(_as_list(flags["plugins"]), strategy, devices, flags["num_nodes"])
        hpu_strategy = choice.choose(strategy, devices, flags["num_nodes"], chosen_by_auto=accelerator == "auto")
        if self.check_nodes is not None:
            self.check_nodes(flags["num_nodes"], devices, strategy, plugins)
        precision = flags["precision"]
        if isinstance(precision, str):
            precision = self.precision_aliases.get(precision, precision)
        return {
            **flags,
            "accelerator": choice.accelerator(accelerator, hpu_strategy),
            "devices": devices,
            "strategy": hpu_strategy,
            **self.precisions.resolve(precision, plugins, hpu_strategy, choice.strategy_class(hpu_strategy)),
        }

    def _with_cluster_environment(self, plugins: list[Any], strategy: Any, devices: Any, num_nodes: Any) -> list[Any]:
        """``plugins`` with the environment of a launcher upstream does not detect (mpirun without mpi4py), checked
        against the run now: a mismatch then fails on every rank before any of them waits for another."""
        environment = None if self.cluster_environment is None else self.cluster_environment(plugins, strategy)
        if environment is None:
            return plugins
        if isinstance(devices, int) and isinstance(num_nodes, int):
            environment.validate_settings(num_devices=devices, num_nodes=num_nodes)
        return [*plugins, environment]


def _first_devices(devices: Any, owner: str, error: type[Exception]) -> Any:
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


def _as_list(plugins: Any) -> list[Any]:
    if plugins is None:
        return []
    if isinstance(plugins, Iterable) and not isinstance(plugins, (str, dict)):
        return list(plugins)
    return [plugins]


def _lower(flag: Any) -> Any:
    return flag.lower() if isinstance(flag, str) else flag
