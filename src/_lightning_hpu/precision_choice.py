"""Which HPU precision plugin a set of flags asks for: the rules the Trainer's and Fabric's flag resolution share.

Each of them has its own precision classes (the Trainer's and Fabric's hooks differ) and error type;
:class:`PrecisionChoice` holds those, with the strategies whose plugins are not the general HPU ones as a table of
:class:`PrecisionFamily` rows, and applies the same rules: which plugin the precision flag builds, which HPU plugin
stands for one of upstream's, and which plugins are refused before any work.
"""

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional


class PrecisionFamily(NamedTuple):
    """The precision plugins of one HPU strategy (and its subclasses) when they are not the general HPU ones.

    Args:
        strategy: the HPU strategy class.
        plugin: its HPU precision class (DeepSpeed's leaves backward and the step to its engine, FSDP's sets the dtypes
            of the shards).
        upstream: upstream's precision class that ``plugin`` replaces, as earlier releases' examples and CUDA scripts
            pass it.
        name: the strategy in messages (``"DeepSpeed"``).
    """

    strategy: type
    plugin: type
    upstream: type
    name: str


@dataclass(frozen=True)
class PrecisionChoice:
    """The HPU precision rules for one entry point (``owner``: ``"Trainer"`` or ``"Fabric"``).

    Args:
        owner: the class users build, for messages.
        error: the exception it raises for a misconfiguration.
        general: the HPU precision entry point of every other strategy (``HPUPrecisionPlugin``, ``HPUPrecision``).
        hpu_base: the class every HPU precision plugin of this entry point derives from.
        upstream_base: upstream's fp32 ``Precision`` class of this entry point.
        autocast: upstream's autocast classes of this entry point, which lightning-habana accepted for the HPU.
        strategy_attribute: the strategy's property that holds its precision plugin.
        families: the strategies whose precision plugins are not ``general``.
    """

    owner: str
    error: type[Exception]
    general: type[Any]
    hpu_base: type
    upstream_base: type
    autocast: tuple[type, ...]
    strategy_attribute: str
    families: tuple[PrecisionFamily, ...]

    def _family_of(self, strategy_class: type) -> type[Any]:
        """The HPU precision class that strategies of ``strategy_class`` run with."""
        return next(
            (family.plugin for family in self.families if issubclass(strategy_class, family.strategy)), self.general
        )

    def resolve(self, precision: Any, plugins: list[Any], strategy: Any, strategy_class: type) -> dict[str, Any]:
        """The connector's ``precision`` and ``plugins`` arguments: the HPU plugin of the strategy's family for the
        precision flag, unless ``plugins`` or the strategy instance carry a precision plugin, which becomes that HPU
        plugin."""
        family = self._family_of(strategy_class)
        on_strategy = self._on_strategy(strategy, family)
        if on_strategy is not None:
            # upstream reports a plugin given both ways; a flag would be ignored
            self._refuse_another_flag(precision, on_strategy)
            return {"precision": None, "plugins": plugins}
        precision_plugins = [plugin for plugin in plugins if isinstance(plugin, self.upstream_base)]
        if not precision_plugins:
            plugin = family("32-true" if precision is None else precision)
            return {"precision": None, "plugins": [*plugins, plugin]}
        # upstream reports a precision flag given together with a precision plugin
        given = precision_plugins[0]
        ours = self.as_hpu_plugin(given, family)
        return {"precision": precision, "plugins": [ours if plugin is given else plugin for plugin in plugins]}

    def as_hpu_plugin(self, plugin: Any, family: type[Any]) -> Any:
        """The HPU plugin for a precision plugin passed in ``plugins``; upstream's own ones where they mean the same."""
        special = tuple(row.plugin for row in self.families)
        if isinstance(plugin, self.hpu_base) and plugin._owner != self.owner:
            # the Trainer's plugins derive from Fabric's but run the Trainer's hooks, which Fabric never calls
            raise self.error(
                f"`plugins=[{type(plugin).__name__}(...)]` is the {plugin._owner}'s precision plugin"
                f" (`{type(plugin).__module__}`) and does not run under {self.owner}. Pass"
                f" `{family.__name__}(precision=...)` from `{family.__module__.rsplit('.', 1)[0]}` instead, or use the"
                " `precision` flag."
            )
        if isinstance(plugin, self.hpu_base) and (
            isinstance(plugin, family) if family in special else not isinstance(plugin, special)
        ):
            return plugin
        upstream = next((row.upstream for row in self.families if row.plugin is family), None)
        if type(plugin) in (self.upstream_base, upstream):
            return family(plugin.precision)
        if family is self.general and type(plugin) in self.autocast and plugin.device == "hpu":
            # lightning-habana accepted upstream's autocast plugin for the HPU (also by its 1.x name, as Intel's
            # reference models pass it); ours autocasts the same way and adds Gaudi's rules (op lists, fp16 from Gaudi2)
            return family(plugin.precision)
        with_strategy = next((f" with {row.name}" for row in self.families if row.plugin is family), "")
        raise self.error(
            f"`plugins=[{type(plugin).__name__}(...)]` does not run on HPU{with_strategy}"
            + (" without its strategy" if isinstance(plugin, special) and family is self.general else "")
            + f". Pass `{family.__name__}(precision=...)` instead, or use the `precision` flag."
        )

    def _on_strategy(self, strategy: Any, family: type[Any]) -> Optional[Any]:
        """The precision plugin a strategy instance carries (``SingleHPUStrategy(precision_plugin=...)``), made the HPU
        plugin of its family in place, as upstream's connector later sets its own on the strategy."""
        plugin = getattr(strategy, f"_{self.strategy_attribute}", None)
        if plugin is None:
            return None
        setattr(strategy, self.strategy_attribute, self.as_hpu_plugin(plugin, family))
        return getattr(strategy, self.strategy_attribute)

    def _refuse_another_flag(self, precision: Any, plugin: Any) -> None:
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
        raise self.error(
            f"`{self.owner}(precision={precision!r})` conflicts with the strategy's `{type(plugin).__name__}` in"
            f" {plugin.precision!r}. Set the precision in one place only."
        )
