"""Every public upstream ``lightning.pytorch`` module is importable under ``pytorch_lightning`` as the same object."""

import importlib
import inspect
import pkgutil
from typing import Literal, Optional, Union

import lightning.pytorch
import pytest

import pytorch_lightning


def _public_upstream_modules() -> list:
    names = ["lightning.pytorch"]
    for info in pkgutil.walk_packages(lightning.pytorch.__path__, prefix="lightning.pytorch."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


UPSTREAM_MODULES = _public_upstream_modules()


def _import_or_none(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:  # an optional dependency of that module is missing; upstream cannot import it either
        return None


def test_walk_covers_the_api():
    # the parity check below is only as good as the walk: it must reach deep paths
    for name in ("lightning.pytorch.strategies.ddp", "lightning.pytorch.utilities.rank_zero", "lightning.pytorch.cli"):
        assert name in UPSTREAM_MODULES


@pytest.mark.parametrize("upstream_name", UPSTREAM_MODULES)
def test_module_parity(upstream_name):
    upstream = _import_or_none(upstream_name)
    if upstream is None:
        pytest.skip(f"{upstream_name} needs an optional dependency that is not installed")
    ours = importlib.import_module("pytorch_lightning" + upstream_name[len("lightning.pytorch") :])
    if ours is upstream:
        return
    # one of our own modules: it must offer every public name upstream has, as the same object or an extension
    assert ours.__name__.startswith("pytorch_lightning")
    for name in getattr(upstream, "__all__", [n for n in vars(upstream) if not n.startswith("_")]):
        theirs, mine = getattr(upstream, name), getattr(ours, name)
        if mine is theirs:
            continue
        assert inspect.isclass(mine), f"{ours.__name__}.{name} differs from upstream and is not a class"
        if name.startswith("HPU"):
            # upstream only has stubs that raise NotImplementedError; ours are real
            assert mine.__module__.startswith("pytorch_lightning")
        else:
            assert issubclass(mine, theirs), f"{ours.__name__}.{name} must extend {upstream_name}.{name}"


def test_top_level_objects():
    assert pytorch_lightning.LightningModule is lightning.pytorch.LightningModule
    assert pytorch_lightning.LightningDataModule is lightning.pytorch.LightningDataModule
    assert pytorch_lightning.Callback is lightning.pytorch.Callback
    assert pytorch_lightning.seed_everything is lightning.pytorch.seed_everything
    assert issubclass(pytorch_lightning.Trainer, lightning.pytorch.Trainer)
    assert pytorch_lightning.Trainer is not lightning.pytorch.Trainer
    # attribute access reaches subpackages the way ``import pytorch_lightning as pl; pl.callbacks`` users expect
    assert pytorch_lightning.callbacks.ModelCheckpoint is lightning.pytorch.callbacks.ModelCheckpoint
    assert pytorch_lightning.utilities.rank_zero is lightning.pytorch.utilities.rank_zero
    assert pytorch_lightning.trainer.Trainer is pytorch_lightning.Trainer


def test_deep_import_forms():
    from pytorch_lightning.demos.boring_classes import BoringModel
    from pytorch_lightning.strategies.ddp import DDPStrategy
    from pytorch_lightning.trainer.trainer import Trainer

    assert BoringModel is lightning.pytorch.demos.boring_classes.BoringModel
    assert DDPStrategy is lightning.pytorch.strategies.DDPStrategy
    assert Trainer is pytorch_lightning.Trainer
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("pytorch_lightning.no_such_module")


def test_version():
    assert pytorch_lightning.__version__ == f"{lightning.__version__}+hpu"


def test_trainer_signature_and_doc():
    ours, theirs = inspect.signature(pytorch_lightning.Trainer), inspect.signature(lightning.pytorch.Trainer)
    # upstream's parameters, names, kinds and defaults, in order; ``precision`` also takes "fp8" (Gaudi2 and newer)
    assert list(ours.parameters) == list(theirs.parameters)
    for name, parameter in theirs.parameters.items():
        if name == "precision":
            assert ours.parameters[name].annotation == Optional[Union[parameter.annotation, Literal["fp8"]]]
            assert ours.parameters[name].replace(annotation=parameter.annotation) == parameter
        else:
            assert ours.parameters[name] == parameter, name
    assert ours.return_annotation == theirs.return_annotation
    assert pytorch_lightning.Trainer.__init__.__doc__ == lightning.pytorch.Trainer.__init__.__doc__


def test_trainer_env_defaults(monkeypatch):
    monkeypatch.setenv("PL_TRAINER_MAX_EPOCHS", "3")
    monkeypatch.setenv("PL_TRAINER_LOGGER", "False")
    trainer = pytorch_lightning.Trainer(accelerator="cpu")
    assert trainer.max_epochs == 3
    assert trainer.logger is None
    # an explicit argument wins over the environment
    assert pytorch_lightning.Trainer(accelerator="cpu", max_epochs=5).max_epochs == 5


def test_lightning_fabric_alias():
    import lightning.fabric

    import lightning_fabric
    from lightning_fabric.strategies.ddp import DDPStrategy
    from lightning_fabric.utilities.seed import seed_everything

    # our own package, re-exporting every upstream name as the same object
    assert lightning_fabric.Fabric is lightning.fabric.Fabric
    assert set(lightning.fabric.__all__) <= set(lightning_fabric.__all__)
    assert lightning_fabric.strategies.DDPStrategy is lightning.fabric.strategies.DDPStrategy
    assert DDPStrategy is lightning.fabric.strategies.ddp.DDPStrategy
    assert seed_everything is lightning.fabric.utilities.seed.seed_everything
