"""Upstream's Trainer connector with Intel Gaudi (HPU) flags resolved first."""

from collections.abc import Iterable
from typing import Optional, Union

from lightning.pytorch.accelerators.accelerator import Accelerator
from lightning.pytorch.plugins import _PLUGIN_INPUT
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.trainer.connectors.accelerator_connector import (
    _LITERAL_WARN,
    _PRECISION_INPUT,
    _AcceleratorConnector,
)


class HPUAcceleratorConnector(_AcceleratorConnector):
    """``lightning.pytorch.trainer.connectors.accelerator_connector._AcceleratorConnector`` that first turns HPU flags
    into the instances upstream accepts.

    Every ``Trainer`` builds it, ``lightning.Trainer`` as much as ``pytorch_lightning.Trainer``, so both resolve the
    same flags the same way. Arguments that do not involve an HPU reach upstream unchanged. The resolution is imported
    when a ``Trainer`` is built: this module is loaded while ``lightning`` itself is still being imported.
    """

    def __init__(
        self,
        devices: Union[list[int], str, int] = "auto",
        num_nodes: int = 1,
        accelerator: Union[str, Accelerator] = "auto",
        strategy: Union[str, Strategy] = "auto",
        plugins: Optional[Union[_PLUGIN_INPUT, Iterable[_PLUGIN_INPUT]]] = None,
        precision: Optional[_PRECISION_INPUT] = None,
        sync_batchnorm: bool = False,
        benchmark: Optional[bool] = None,
        use_distributed_sampler: bool = True,
        deterministic: Optional[Union[bool, _LITERAL_WARN]] = None,
    ) -> None:
        from pytorch_lightning.trainer.hpu_flags import check_sync_batchnorm, resolve_hpu_flags

        flags = resolve_hpu_flags(
            {
                "devices": devices,
                "num_nodes": num_nodes,
                "accelerator": accelerator,
                "strategy": strategy,
                "plugins": plugins,
                "precision": precision,
            }
        )
        if sync_batchnorm:
            check_sync_batchnorm(flags["accelerator"])
        super().__init__(
            **flags,
            sync_batchnorm=sync_batchnorm,
            benchmark=benchmark,
            use_distributed_sampler=use_distributed_sampler,
            deterministic=deterministic,
        )
