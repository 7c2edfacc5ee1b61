"""Upstream's Fabric connector with Intel Gaudi (HPU) flags resolved first."""

from collections.abc import Iterable
from typing import Any, Optional, Union

from lightning.fabric.accelerators import Accelerator
from lightning.fabric.connector import _PLUGIN_INPUT, _PRECISION_INPUT, _Connector
from lightning.fabric.strategies import Strategy
from typing_extensions import override


class HPUConnector(_Connector):
    """``lightning.fabric.connector._Connector`` that first turns HPU flags into the instances upstream accepts.

    Arguments that do not involve an HPU reach upstream unchanged; the ``LT_*`` variables of ``fabric run`` are
    applied first, as upstream applies them. The resolution is imported when a ``Fabric`` is built: this module is
    loaded while ``lightning`` itself is still being imported.
    """

    def __init__(
        self,
        accelerator: Union[str, Accelerator] = "auto",
        strategy: Union[str, Strategy] = "auto",
        devices: Union[list[int], str, int] = "auto",
        num_nodes: int = 1,
        precision: Optional[_PRECISION_INPUT] = None,
        plugins: Optional[Union[_PLUGIN_INPUT, Iterable[_PLUGIN_INPUT]]] = None,
    ) -> None:
        from lightning_fabric.hpu_flags import resolve_hpu_flags

        # `fabric run` passes its flags as LT_* variables, which win over the arguments as upstream reads them
        flags: dict[str, Any] = {
            "accelerator": _Connector._argument_from_env("accelerator", accelerator, default="auto"),
            "strategy": _Connector._argument_from_env("strategy", strategy, default="auto"),
            "devices": _Connector._argument_from_env("devices", devices, default="auto"),
            "num_nodes": int(_Connector._argument_from_env("num_nodes", num_nodes, default=1)),
            "precision": _Connector._argument_from_env("precision", precision, default=None),
            "plugins": plugins,
        }
        super().__init__(**resolve_hpu_flags(flags))

    @staticmethod
    @override
    def _argument_from_env(name: str, current: Any, default: Any) -> Any:
        # read before the resolution above: read again, they would be compared with the objects resolved from them
        return current
