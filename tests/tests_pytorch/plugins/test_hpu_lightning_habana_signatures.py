"""Every constructor signature lightning-habana published (1.4 to 1.7) for a class we have works here unchanged:
its precision plugins took ``device="hpu"`` after ``precision`` (and 1.4/1.5 ``recipe``, ``replace_layers`` after
that), where Lightning 1.x's ``HPUPrecisionPlugin`` took ``opt_level`` second; both calls keep working."""

import inspect

import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

import lightning_fabric.plugins as fabric_plugins
import pytorch_lightning as pl
from pytorch_lightning.plugins import (
    HPUDeepSpeedPrecisionPlugin,
    HPUFP8Precision,
    HPUFSDPPrecision,
    HPUMixedPrecision,
    HPUPrecisionPlugin,
)

# (class, positional arguments, keyword arguments, precision built): lightning-habana's calls of each release
_CALLS = [
    # HPUPrecisionPlugin(precision, device="hpu") in 1.6/1.7; 1.4/1.5 added recipe and replace_layers
    (HPUPrecisionPlugin, ("bf16-mixed", "hpu"), {}, "bf16-mixed"),
    (HPUPrecisionPlugin, ("bf16-mixed",), {"device": "hpu"}, "bf16-mixed"),
    (HPUPrecisionPlugin, (), {"precision": "32-true", "device": torch.device("hpu")}, "32-true"),
    (HPUPrecisionPlugin, (), {"device": "hpu"}, "32-true"),
    (HPUPrecisionPlugin, ("16-mixed", "hpu", None, False), {}, "16-mixed"),
    (HPUPrecisionPlugin, ("fp8", "hpu", {"fp8_format": "HYBRID"}, True), {}, "fp8"),
    (HPUPrecisionPlugin, ("fp8",), {"device": "hpu", "recipe": None, "replace_layers": True}, "fp8"),
    # HPUDeepSpeedPrecisionPlugin(precision, device="hpu"): 1.4, 1.6, 1.7; with recipe, replace_layers: 1.5
    (HPUDeepSpeedPrecisionPlugin, ("bf16-mixed", "hpu"), {}, "bf16-mixed"),
    (HPUDeepSpeedPrecisionPlugin, (), {"device": "hpu"}, "32-true"),
    (HPUDeepSpeedPrecisionPlugin, ("fp8", "hpu", {"fp8_format": "HYBRID"}, False), {}, "fp8"),
    # HPUFSDPPrecision(precision, device="hpu", recipe=None, replace_layers=False): 1.5 to 1.7
    (HPUFSDPPrecision, ("bf16-mixed", "hpu"), {}, "bf16-mixed"),
    (HPUFSDPPrecision, ("bf16-mixed", "hpu", None, False), {}, "bf16-mixed"),
    (HPUFSDPPrecision, ("bf16-mixed",), {"device": "hpu", "recipe": None, "replace_layers": False}, "bf16-mixed"),
    # Fabric's HPUPrecision(precision, device="hpu"): 1.4 to 1.7
    (fabric_plugins.HPUPrecision, ("bf16-mixed", "hpu"), {}, "bf16-mixed"),
    (fabric_plugins.HPUPrecision, ("32-true",), {"device": "hpu"}, "32-true"),
    # Fabric's HPUFSDPPrecision(precision, device="hpu", recipe=None, replace_layers=False): 1.6, 1.7
    (fabric_plugins.HPUFSDPPrecision, ("bf16-mixed", "hpu", None, False), {}, "bf16-mixed"),
    (fabric_plugins.HPUFSDPPrecision, ("bf16-mixed",), {"device": "hpu"}, "bf16-mixed"),
]


@pytest.mark.usefixtures("amx_host")
@pytest.mark.parametrize(("cls", "args", "kwargs", "precision"), _CALLS)
def test_lightning_habana_calls_build_the_plugin_of_their_precision(cls, args, kwargs, precision):
    plugin = cls(*args, **kwargs)
    # Fabric's entry point builds Fabric's plugin of the precision, an HPU plugin like every one of them
    assert isinstance(plugin, fabric_plugins.HPUPrecision) and plugin.precision == precision and plugin.device == "hpu"
    if len(args) > 2 and isinstance(args[2], dict):  # lightning-habana 1.4/1.5's positional recipe
        assert plugin.recipe.fp8_format.name == "HYBRID"
    if len(args) > 3 and args[3] or kwargs.get("replace_layers"):
        assert plugin.replace_layers is True


def test_the_device_keyword_is_in_every_signature():
    """What LightningCLI and the docs read: a YAML written for lightning-habana (``device: hpu``) validates."""
    for cls in (
        HPUPrecisionPlugin,
        HPUDeepSpeedPrecisionPlugin,
        HPUFSDPPrecision,
        fabric_plugins.HPUPrecision,
        fabric_plugins.HPUFSDPPrecision,
        fabric_plugins.HPUDeepSpeedPrecision,
    ):
        assert inspect.signature(cls).parameters["device"].default == "hpu", cls


def test_lightning_1x_positional_opt_level_still_means_opt_level():
    assert type(HPUPrecisionPlugin("bf16-mixed", "O1")) is HPUMixedPrecision
    with pytest.raises(ValueError, match=r"opt_level='O2'"):
        HPUPrecisionPlugin("bf16-mixed", "O2")


@pytest.mark.parametrize(
    "call",
    [
        lambda: HPUPrecisionPlugin("bf16-mixed", "cuda"),
        lambda: HPUPrecisionPlugin(device="cpu"),
        lambda: HPUDeepSpeedPrecisionPlugin("bf16-mixed", device="cuda"),
        lambda: HPUFSDPPrecision("bf16-mixed", "cpu"),
        lambda: fabric_plugins.HPUPrecision("bf16-mixed", torch.device("cpu")),
    ],
)
def test_a_device_other_than_hpu_is_refused(call):
    with pytest.raises(ValueError, match="run on 'hpu' only"):
        call()


def test_fsdp_refuses_fp8_settings_that_lightning_habana_ignored():
    with pytest.raises(ValueError, match="FSDP does not train in fp8"):
        HPUFSDPPrecision("bf16-mixed", "hpu", None, True)
    # upstream FSDP's own positional scaler keeps its place
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    scaler = ShardedGradScaler(device="hpu")
    assert HPUFSDPPrecision("16-mixed", scaler).scaler is scaler
    # and without one, "16-mixed" scales the loss with one on the HPU (upstream's constructor dropped both)
    assert HPUFSDPPrecision("16-mixed", "hpu").scaler._device == "hpu"


def test_too_many_positional_arguments_name_lightning_habanas_order():
    with pytest.raises(TypeError, match=r"precision, device, recipe, replace_layers"):
        HPUPrecisionPlugin("fp8", "hpu", None, False, "extra")


class _RecordsDtype(BoringModel):
    def training_step(self, batch, batch_idx):
        output = self.layer(batch)
        self.activation_dtype = output.dtype
        return {"loss": self.loss(output.float())}


def test_a_trainer_and_fabric_run_with_lightning_habanas_calls(tmp_path):
    model = _RecordsDtype()
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        plugins=[HPUPrecisionPlugin("bf16-mixed", "hpu")],
        max_steps=1,
        limit_val_batches=0,
        default_root_dir=tmp_path,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    assert isinstance(trainer.precision_plugin, HPUMixedPrecision) and model.activation_dtype == torch.bfloat16

    import lightning

    fabric = lightning.Fabric(accelerator="hpu", devices=1, plugins=[fabric_plugins.HPUPrecision("bf16-mixed", "hpu")])
    assert isinstance(fabric.strategy.precision, fabric_plugins.HPUMixedPrecision)
    with fabric.autocast():
        output = torch.nn.Linear(4, 2, device=fabric.device)(torch.randn(3, 4, device=fabric.device))
    assert output.dtype == torch.bfloat16


def test_the_fp8_plugin_class_takes_no_device():
    # HPUFP8Precision is ours alone; it is built through HPUPrecisionPlugin(precision="fp8", device=...)
    assert "device" not in inspect.signature(HPUFP8Precision).parameters
