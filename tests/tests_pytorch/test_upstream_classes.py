"""Each HPU accelerator, strategy and plugin, of the Trainer and of Fabric, is an instance of the upstream class it
stands for, so that upstream's ``isinstance`` checks treat it as that class (Fabric's FSDP strategy requires an
``FSDPPrecision``, the throughput utilities read the compute dtype by class, the checkpoint connector restores a
``MixedPrecision``'s state). A class with a wrong base, or an HPU class missing from the table, fails here.
"""

import inspect

import lightning.fabric.accelerators as fabric_accelerators
import lightning.fabric.plugins as fabric_plugins
import lightning.fabric.plugins.io as fabric_io
import lightning.fabric.strategies as fabric_strategies
import lightning.pytorch.accelerators as trainer_accelerators
import lightning.pytorch.plugins.precision as trainer_precision
import lightning.pytorch.strategies as trainer_strategies
import pytest
import torch
from lightning.fabric import Fabric
from lightning.fabric.utilities.throughput import _plugin_to_compute_dtype

import lightning_fabric.accelerators as hpu_fabric_accelerators
import lightning_fabric.plugins as hpu_fabric_plugins
import lightning_fabric.strategies as hpu_fabric_strategies
import pytorch_lightning.accelerators as hpu_accelerators
import pytorch_lightning.plugins as hpu_plugins
import pytorch_lightning.strategies as hpu_strategies

# (the HPU class, the upstream class it stands for); the Trainer's classes against lightning.pytorch's, Fabric's
# against lightning.fabric's. The fp8 plugins autocast to bf16 around Gaudi's Transformer Engine modules, as
# ``MixedPrecision`` autocasts; upstream's ``TransformerEnginePrecision`` holds the whole model in one dtype with
# NVIDIA's Transformer Engine, so it is not their base.
BASES = [
    (hpu_accelerators.HPUAccelerator, trainer_accelerators.Accelerator),
    (hpu_fabric_accelerators.HPUAccelerator, fabric_accelerators.Accelerator),
    (hpu_strategies.SingleHPUStrategy, trainer_strategies.SingleDeviceStrategy),
    (hpu_strategies.HPUParallelStrategy, trainer_strategies.DDPStrategy),
    (hpu_strategies.HPUFSDPStrategy, trainer_strategies.FSDPStrategy),
    (hpu_strategies.HPUDeepSpeedStrategy, trainer_strategies.DeepSpeedStrategy),
    (hpu_strategies.HPUModelParallelStrategy, trainer_strategies.ModelParallelStrategy),
    (hpu_fabric_strategies.SingleHPUStrategy, fabric_strategies.SingleDeviceStrategy),
    (hpu_fabric_strategies.HPUParallelStrategy, fabric_strategies.DDPStrategy),
    (hpu_fabric_strategies.HPUFSDPStrategy, fabric_strategies.FSDPStrategy),
    (hpu_fabric_strategies.HPUDeepSpeedStrategy, fabric_strategies.DeepSpeedStrategy),
    (hpu_fabric_strategies.HPUModelParallelStrategy, fabric_strategies.ModelParallelStrategy),
    # one checkpoint plugin serves both, as upstream's TorchCheckpointIO does
    (hpu_plugins.HPUCheckpointIO, fabric_io.TorchCheckpointIO),
    (hpu_plugins.HPUPrecisionPlugin, trainer_precision.Precision),
    (hpu_plugins.HPUMixedPrecision, trainer_precision.MixedPrecision),
    (hpu_plugins.HPUHalfPrecision, trainer_precision.HalfPrecision),
    (hpu_plugins.HPUFP8Precision, trainer_precision.MixedPrecision),
    (hpu_plugins.HPUFP8InferencePrecision, trainer_precision.Precision),
    (hpu_plugins.HPUFSDPPrecision, trainer_precision.FSDPPrecision),
    (hpu_plugins.HPUDeepSpeedPrecisionPlugin, trainer_precision.DeepSpeedPrecision),
    (hpu_fabric_plugins.HPUPrecision, fabric_plugins.Precision),
    (hpu_fabric_plugins.HPUMixedPrecision, fabric_plugins.MixedPrecision),
    (hpu_fabric_plugins.HPUHalfPrecision, fabric_plugins.HalfPrecision),
    (hpu_fabric_plugins.HPUFP8Precision, fabric_plugins.MixedPrecision),
    (hpu_fabric_plugins.HPUFP8InferencePrecision, fabric_plugins.Precision),
    (hpu_fabric_plugins.HPUFSDPPrecision, fabric_plugins.FSDPPrecision),
    (hpu_fabric_plugins.HPUDeepSpeedPrecision, fabric_plugins.DeepSpeedPrecision),
]
# what the table must cover: every class of these kinds that our packages export
KINDS = (
    fabric_accelerators.Accelerator,
    fabric_strategies.Strategy,
    trainer_strategies.Strategy,
    fabric_plugins.Precision,
    fabric_io.CheckpointIO,
)
PACKAGES = (
    hpu_accelerators,
    hpu_strategies,
    hpu_plugins,
    hpu_fabric_accelerators,
    hpu_fabric_strategies,
    hpu_fabric_plugins,
)


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@pytest.mark.parametrize(("hpu", "upstream"), BASES, ids=[f"{_name(h)}-{u.__name__}" for h, u in BASES])
def test_hpu_class_is_its_upstream_class(hpu, upstream):
    assert issubclass(hpu, upstream), f"{_name(hpu)} is not a subclass of {_name(upstream)}: give it that base"


def test_every_hpu_class_is_in_the_table():
    exported = {
        value
        for package in PACKAGES
        for value in vars(package).values()
        if inspect.isclass(value) and issubclass(value, KINDS) and value.__module__.split(".")[0] != "lightning"
    }
    assert exported == {hpu for hpu, _ in BASES}, sorted(map(_name, exported ^ {hpu for hpu, _ in BASES}))


def test_fabric_deepspeed_plugin_is_fabrics_deepspeed_precision():
    """Built on the Trainer's HPU plugin, which is the Trainer's ``DeepSpeedPrecision`` only."""
    assert isinstance(hpu_fabric_plugins.HPUDeepSpeedPrecision("bf16-mixed"), fabric_plugins.DeepSpeedPrecision)
    assert not isinstance(hpu_plugins.HPUDeepSpeedPrecisionPlugin("bf16-mixed"), fabric_plugins.DeepSpeedPrecision)


@pytest.mark.parametrize(
    ("strategy", "devices", "precision", "dtype", "plugin"),
    [
        ("auto", 1, "32-true", torch.float32, "HPUPrecision"),
        ("auto", 1, "bf16-mixed", torch.bfloat16, "HPUMixedPrecision"),
        ("auto", 1, "16-mixed", torch.float16, "HPUMixedPrecision"),
        ("auto", 1, "bf16-true", torch.bfloat16, "HPUHalfPrecision"),
        ("auto", 1, "16-true", torch.float16, "HPUHalfPrecision"),
        # the ops outside Transformer Engine modules, most of a model's, compute in bf16
        ("auto", 1, "transformer-engine", torch.bfloat16, "HPUFP8Precision"),
        ("ddp", 2, "bf16-mixed", torch.bfloat16, "HPUMixedPrecision"),
        ("deepspeed", 2, "32-true", torch.float32, "HPUDeepSpeedPrecision"),
        ("deepspeed", 2, "bf16-mixed", torch.bfloat16, "HPUDeepSpeedPrecision"),
        ("deepspeed", 2, "16-mixed", torch.float16, "HPUDeepSpeedPrecision"),
        ("deepspeed", 2, "transformer-engine", torch.bfloat16, "HPUDeepSpeedPrecision"),
        ("fsdp", 2, "bf16-mixed", torch.bfloat16, "HPUFSDPPrecision"),
        ("fsdp", 2, "16-mixed", torch.float16, "HPUFSDPPrecision"),
    ],
)
def test_fabric_compute_dtype(strategy, devices, precision, dtype, plugin):
    """Upstream's compute-dtype lookup (what ``ThroughputMonitor`` counts FLOPs in) reads the Fabric HPU plugins as it
    reads the upstream plugins they stand for."""
    fabric = Fabric(accelerator="hpu", devices=devices, strategy=strategy, precision=precision)
    assert type(fabric._precision) is getattr(hpu_fabric_plugins, plugin)
    assert _plugin_to_compute_dtype(fabric._precision) == dtype
