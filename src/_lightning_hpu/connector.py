"""Upstream's Fabric connector with Intel Gaudi (HPU) flags resolved first."""

from collections.abc import Iterable
from typing import Any, Optional, Union

from lightning.fabric.accelerators import Accelerator
from lightning.fabric.connector import _PLUGIN_INPUT, _PRECISION_INPUT, _Connector
from lightning.fabric.strategies import Strategy


class HPUConnector(_Connector):
    """``lightning.fabric.connector._Connector`` that first turns HPU flags into the instances upstream accepts.

    Arguments that do not involve an HPU reach upstream unchanged. The resolution is imported when a ``Fabric`` is
    built: this module is loaded while ``lightning`` itself is still being imported.
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

        flags: dict[str, Any] = {
            "accelerator": accelerator,
            "strategy": strategy,
            "devices": devices,
            "num_nodes": num_nodes,
            "precision": precision,
            "plugins": plugins,
        }
        super().__init__(**resolve_hpu_flags(flags))
