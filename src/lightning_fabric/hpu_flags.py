"""Turn Fabric's HPU flags into objects upstream's connector accepts.

Upstream's Fabric accepts an accelerator instance, a registered strategy name and a ``Precision`` in ``plugins``, but
never picks HPU for ``"auto"``, maps ``"ddp"``/``"deepspeed"`` to its CUDA/CPU strategies and its precision flags to
CUDA's plugins. ``_lightning_hpu.connector.HPUConnector`` calls :func:`resolve_hpu_flags` before upstream's connector
runs; the shared resolver (:class:`_lightning_hpu.flags.HPUFlags`) does the work, with Fabric's classes given here.
"""

from typing import Any

from lightning.fabric.plugins.precision import DeepSpeedPrecision, FSDPPrecision, MixedPrecision, Precision
from lightning.fabric.strategies import STRATEGY_REGISTRY, Strategy

from _lightning_hpu.flags import HPUFlags
from _lightning_hpu.precision_choice import PrecisionChoice, PrecisionFamily
from _lightning_hpu.strategy_choice import StrategyChoice, counterparts
from lightning_fabric.accelerators.hpu import HPUAccelerator
from lightning_fabric.plugins.environments.hpu_lightning import hpu_cluster_environment
from lightning_fabric.plugins.precision import HPUDeepSpeedPrecision, HPUFSDPPrecision, HPUPrecision
from lightning_fabric.strategies import (
    HPUDeepSpeedStrategy,
    HPUFSDPStrategy,
    HPUModelParallelStrategy,
    HPUParallelStrategy,
    SingleHPUStrategy,
)
from lightning_fabric.strategies._hpu import _HPUStrategyMixin
from lightning_fabric.strategies.hpu_deepspeed import hpu_name_of


def resolve_hpu_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """Return Fabric's arguments with HPU flags resolved; arguments that do not involve HPU come back unchanged."""
    return _FLAGS.resolve(flags)


_FLAGS = HPUFlags(
    strategies=StrategyChoice(
        owner="Fabric",
        accelerator_class=HPUAccelerator,
        registry=STRATEGY_REGISTRY,
        strategy_base=Strategy,
        hpu_base=_HPUStrategyMixin,
        single=SingleHPUStrategy.strategy_name,
        parallel=HPUParallelStrategy.strategy_name,
        error=ValueError,
        counterparts=counterparts(
            SingleHPUStrategy, HPUParallelStrategy, HPUDeepSpeedStrategy, HPUFSDPStrategy, HPUModelParallelStrategy
        ),
        preset_name=hpu_name_of,
    ),
    precisions=PrecisionChoice(
        owner="Fabric",
        error=ValueError,
        general=HPUPrecision,
        hpu_base=HPUPrecision,
        upstream_base=Precision,
        autocast=(MixedPrecision,),
        strategy_attribute="precision",
        families=(
            PrecisionFamily(HPUDeepSpeedStrategy, HPUDeepSpeedPrecision, DeepSpeedPrecision, "DeepSpeed"),
            PrecisionFamily(HPUFSDPStrategy, HPUFSDPPrecision, FSDPPrecision, "FSDP"),
        ),
    ),
    unavailable=RuntimeError,
    work="run",
    cluster_environment=hpu_cluster_environment,
    # Fabric's fp8 flag on CUDA (NVIDIA's Transformer Engine) is fp8 with Gaudi's
    precision_aliases={"transformer-engine": "fp8"},
)
