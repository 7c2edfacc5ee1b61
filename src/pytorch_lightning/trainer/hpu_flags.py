"""Turn the Trainer's HPU flags into objects upstream's accelerator connector accepts.

Upstream Lightning 2.6 refuses ``accelerator="hpu"``, never picks HPU for ``"auto"`` and maps mixed precision to CUDA.
The shared resolver (:class:`_lightning_hpu.flags.HPUFlags`) turns them into the instances upstream accepts; here are
the Trainer's classes it maps to, and the checks of a multi-node run only the Trainer makes.
"""

import os
from typing import Any, Union

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

from _lightning_hpu.flags import HPUFlags
from _lightning_hpu.precision_choice import PrecisionChoice, PrecisionFamily
from _lightning_hpu.strategy_choice import StrategyChoice, counterparts
from lightning_fabric.plugins.environments.hpu_lightning import hpu_cluster_environment
from lightning_fabric.strategies.hpu_deepspeed import hpu_name_of
from pytorch_lightning.accelerators.hpu import HPUAccelerator
from pytorch_lightning.plugins.precision.hpu import HPUPrecisionPlugin
from pytorch_lightning.plugins.precision.hpu_deepspeed import HPUDeepSpeedPrecisionPlugin
from pytorch_lightning.plugins.precision.hpu_fsdp import HPUFSDPPrecision
from pytorch_lightning.profilers.hpu import HPUProfiler
from pytorch_lightning.strategies._hpu import _HPUTrainerStrategyMixin
from pytorch_lightning.strategies.hpu_deepspeed import HPUDeepSpeedStrategy
from pytorch_lightning.strategies.hpu_fsdp import HPUFSDPStrategy
from pytorch_lightning.strategies.hpu_model_parallel import HPUModelParallelStrategy
from pytorch_lightning.strategies.hpu_parallel import HPUParallelStrategy
from pytorch_lightning.strategies.single_hpu import SingleHPUStrategy


def resolve_hpu_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """Return the connector's arguments (``accelerator``, ``strategy``, ``devices``, ``num_nodes``, ``precision``,
    ``plugins``) with HPU flags resolved; arguments that do not involve HPU come back unchanged."""
    return _FLAGS.resolve(flags)


def resolve_profiler(profiler: Any) -> Any:
    """``profiler="hpu"``, which upstream's fixed list of profiler names lacks, becomes an ``HPUProfiler``."""
    if isinstance(profiler, str) and profiler.lower() == "hpu":
        return HPUProfiler()
    return profiler


def check_sync_batchnorm(accelerator: Any) -> None:
    """``sync_batchnorm=True`` on HPUs, before any process starts: torch's ``SyncBatchNorm`` must take hpu tensors."""
    from virtual_hpu import torch_support

    if isinstance(accelerator, HPUAccelerator) and not torch_support.sync_batchnorm_takes_hpu():
        raise MisconfigurationException(
            f"`Trainer(sync_batchnorm=True)` on HPUs needs torch {torch_support.SYNC_BATCHNORM_TAKES_HPU} or newer"
            " (Gaudi software 1.24 or newer): the `torch.nn.SyncBatchNorm` of this torch"
            f" ({torch_support.installed()}) normalises CUDA tensors only. Upgrade, or leave `sync_batchnorm` off."
        )


def _check_nodes(num_nodes: Any, devices: int, strategy: Union[str, Strategy], plugins: list[Any]) -> None:
    """Before any process starts: the ``WORLD_SIZE`` and the rendezvous of a run that no cluster environment manages.
    A ``num_nodes`` that is not a positive int is left to upstream, which reports it."""
    if isinstance(num_nodes, int) and num_nodes > 0 and not _cluster_is_managed(strategy, plugins):
        _validate_world_size(num_nodes, devices)
        _validate_rendezvous(num_nodes)


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


_FLAGS = HPUFlags(
    strategies=StrategyChoice(
        owner="Trainer",
        accelerator_class=HPUAccelerator,
        registry=StrategyRegistry,
        strategy_base=Strategy,
        hpu_base=_HPUTrainerStrategyMixin,
        single=SingleHPUStrategy.strategy_name,
        parallel=HPUParallelStrategy.strategy_name,
        error=MisconfigurationException,
        counterparts=counterparts(
            SingleHPUStrategy, HPUParallelStrategy, HPUDeepSpeedStrategy, HPUFSDPStrategy, HPUModelParallelStrategy
        ),
        preset_name=hpu_name_of,
    ),
    precisions=PrecisionChoice(
        owner="Trainer",
        error=MisconfigurationException,
        general=HPUPrecisionPlugin,
        hpu_base=HPUPrecisionPlugin,
        upstream_base=Precision,
        autocast=(MixedPrecision, MixedPrecisionPlugin),
        strategy_attribute="precision_plugin",
        families=(
            PrecisionFamily(HPUDeepSpeedStrategy, HPUDeepSpeedPrecisionPlugin, DeepSpeedPrecision, "DeepSpeed"),
            PrecisionFamily(HPUFSDPStrategy, HPUFSDPPrecision, FSDPPrecision, "FSDP"),
        ),
    ),
    unavailable=MisconfigurationException,
    work="train",
    check_nodes=_check_nodes,
    cluster_environment=hpu_cluster_environment,
)
