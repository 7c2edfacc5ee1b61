"""``LightningCLI`` builds our Trainer and accepts HPU flags, names and class paths."""

import pytest
from lightning.pytorch.demos.boring_classes import BoringModel

from pytorch_lightning.accelerators import HPUAccelerator
from pytorch_lightning.cli import LightningCLI
from pytorch_lightning.plugins import HPUCheckpointIO, HPUPrecisionPlugin
from pytorch_lightning.strategies import HPUParallelStrategy, SingleHPUStrategy
from pytorch_lightning.trainer import Trainer


def _cli(*args: str) -> LightningCLI:
    return LightningCLI(BoringModel, run=False, args=["--trainer.logger=false", *args])


@pytest.mark.parametrize(
    ("args", "strategy", "devices"),
    [
        (["--trainer.accelerator=hpu", "--trainer.devices=1"], SingleHPUStrategy, 1),
        (["--trainer.accelerator=auto", "--trainer.devices=2"], HPUParallelStrategy, 2),
        (["--trainer.accelerator=hpu", "--trainer.strategy=hpu_single"], SingleHPUStrategy, 1),
        (
            ["--trainer.accelerator=hpu", "--trainer.strategy=hpu_parallel", "--trainer.devices=2"],
            HPUParallelStrategy,
            2,
        ),
    ],
)
def test_flags(args, strategy, devices):
    trainer = _cli(*args).trainer
    assert type(trainer) is Trainer
    assert isinstance(trainer.accelerator, HPUAccelerator)
    assert type(trainer.strategy) is strategy and trainer.num_devices == devices


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_precision_string(precision):
    trainer = _cli("--trainer.accelerator=hpu", "--trainer.devices=1", f"--trainer.precision={precision}").trainer
    assert isinstance(trainer.precision_plugin, HPUPrecisionPlugin)
    assert trainer.precision_plugin.precision == precision


def test_class_paths():
    trainer = _cli(
        '--trainer.accelerator={"class_path": "pytorch_lightning.accelerators.HPUAccelerator"}',
        "--trainer.strategy=pytorch_lightning.strategies.HPUParallelStrategy",
        "--trainer.strategy.init_args.static_graph=true",
        "--trainer.devices=2",
        '--trainer.plugins=[{"class_path": "pytorch_lightning.plugins.HPUPrecisionPlugin",'
        ' "init_args": {"precision": "bf16-mixed"}}, {"class_path": "pytorch_lightning.plugins.HPUCheckpointIO"}]',
    ).trainer
    assert isinstance(trainer.accelerator, HPUAccelerator)
    assert isinstance(trainer.strategy, HPUParallelStrategy)
    # jsonargparse fills in every DistributedDataParallel argument, as it does for upstream's DDPStrategy
    assert trainer.strategy._ddp_kwargs["static_graph"] is True
    assert trainer.precision_plugin.precision == "bf16-mixed"
    assert isinstance(trainer.strategy.checkpoint_io, HPUCheckpointIO)


FP8_ARGS = ' "init_args": {"precision": "fp8"}}'


class TransformerEngineModel(BoringModel):
    """BoringModel with its layer from Gaudi's Transformer Engine, as a model written for fp8 has it."""

    def __init__(self) -> None:
        super().__init__()
        from habana_frameworks.torch.hpex.experimental import transformer_engine as te

        self.layer = te.Linear(32, 2)


def _fit_three_steps(model_class: type, *args: str) -> LightningCLI:
    return LightningCLI(
        model_class,
        save_config_callback=None,
        args=[
            "fit",
            "--trainer.logger=false",
            "--trainer.enable_checkpointing=false",
            "--trainer.accelerator=hpu",
            "--trainer.devices=1",
            "--trainer.max_steps=3",
            *args,
        ],
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--trainer.precision=fp8"],
        ['--trainer.plugins={"class_path": "pytorch_lightning.plugins.HPUPrecisionPlugin",' + FP8_ARGS],
    ],
    ids=["flag", "plugin"],
)
@pytest.mark.usefixtures("amx_host")
def test_fp8_training(args):
    cli = _fit_three_steps(TransformerEngineModel, *args)
    assert cli.trainer.precision_plugin.precision == "fp8"
    # the Transformer Engine layer trained in fp8: its scaling state followed the steps
    assert cli.model.layer.fp8_state.state_dict()["steps"] >= 2


_RECIPE = '"recipe": {"fp8_format": "HYBRID", "amax_history_len": 4}'


@pytest.mark.parametrize(
    "plugin",
    [
        '{"class_path": "pytorch_lightning.plugins.HPUPrecisionPlugin", "init_args": {"precision": "fp8",'
        f' "replace_layers": true, {_RECIPE}}}}}',
        '{"class_path": "pytorch_lightning.plugins.HPUFP8Precision",'
        f' "init_args": {{"replace_layers": true, {_RECIPE}}}}}',
    ],
    ids=["entry_point", "class"],
)
@pytest.mark.usefixtures("amx_host")
def test_fp8_recipe_and_layer_replacement_from_the_command_line(plugin):
    from habana_frameworks.torch.hpex.experimental import transformer_engine as te

    cli = _fit_three_steps(BoringModel, f"--trainer.plugins={plugin}")
    assert cli.trainer.precision_plugin.recipe.fp8_format == te.recipe.Format.HYBRID
    # the plain linear layer was replaced at set-up and trained in fp8 with the recipe's history
    assert isinstance(cli.model.layer, te.Linear)
    state = cli.model.layer.fp8_state.state_dict()
    assert state["steps"] >= 2 and state["amax_history"].shape[0] == 4
