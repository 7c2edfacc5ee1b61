"""The HPU precision classes: one per precision, built by ``HPUPrecisionPlugin(precision=...)`` and the flag, and
configured by their constructor alone: building one changes nothing in the process (op lists handed to the bridge
before it loads aside, see ``test_hpu_op_lists.py``)."""

import importlib
import os
import subprocess
import sys

import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.exceptions import MisconfigurationException

import pytorch_lightning as pl
from pytorch_lightning.plugins import (
    HPUDeepSpeedPrecisionPlugin,
    HPUFP8Precision,
    HPUHalfPrecision,
    HPUMixedPrecision,
    HPUPrecisionPlugin,
)
from tests_pytorch.helpers.runif import RunIf

_VARIABLES = ("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", "PT_HPU_AUTOCAST_FP32_OPS_LIST", "LOWER_LIST", "FP32_LIST")


@pytest.fixture(autouse=True)
def _op_lists_of_the_environment(monkeypatch):
    """The session's bridge loaded with the default op lists: the environment names none."""
    for variable in _VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def _mm_dtype() -> torch.dtype:
    """What ``torch.mm`` computes in under bf16 autocast: bf16 with Gaudi's default lists."""
    a = torch.ones(2, 2, device="hpu")
    with torch.autocast("hpu", dtype=torch.bfloat16):
        return torch.mm(a, a).dtype


def _mm_in_fp32(tmp_path) -> dict:
    (tmp_path / "lower.txt").write_text("softmax\n")
    (tmp_path / "fp32.txt").write_text("mm\nlinear\n")
    return {"bf16_file_path": str(tmp_path / "lower.txt"), "fp32_file_path": str(tmp_path / "fp32.txt")}


def _trainer(plugin, **kwargs) -> pl.Trainer:
    return pl.Trainer(
        accelerator="hpu",
        devices=1,
        plugins=[plugin],
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **{"max_steps": 2, **kwargs},
    )


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({}, HPUPrecisionPlugin),
        ({"precision": "32-true"}, HPUPrecisionPlugin),
        ({"precision": "bf16-mixed"}, HPUMixedPrecision),
        ({"precision": 16}, HPUMixedPrecision),
        ({"precision": "16-mixed"}, HPUMixedPrecision),
        ({"precision": "bf16-true"}, HPUHalfPrecision),
        ({"precision": "16-true"}, HPUHalfPrecision),
        ({"precision": "fp8", "replace_layers": True}, HPUFP8Precision),
    ],
)
def test_the_entry_point_builds_the_class_of_each_precision(arguments, expected):
    plugin = HPUPrecisionPlugin(**arguments)
    assert type(plugin) is expected and isinstance(plugin, HPUPrecisionPlugin)
    # the attributes lightning-habana's users read: fp8 available for an fp8 plugin only, as there
    assert plugin.device == "hpu"
    fp8 = arguments.get("precision") == "fp8"
    assert plugin.fp8_training_available is fp8 and plugin.fp8_inference_available is fp8


def test_the_flag_builds_the_same_classes():
    for precision, expected in [
        ("bf16-mixed", HPUMixedPrecision),
        ("bf16-true", HPUHalfPrecision),
        ("fp8", HPUFP8Precision),
    ]:
        trainer = pl.Trainer(accelerator="hpu", devices=1, precision=precision, logger=False)
        assert type(trainer.precision_plugin) is expected
    trainer = pl.Trainer(accelerator="hpu", devices=1, strategy="hpu_deepspeed", precision="fp8", logger=False)
    assert type(trainer.precision_plugin) is HPUDeepSpeedPrecisionPlugin


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"precision": "bf16-true", "bf16_file_path": "ops.txt"}, r"takes no `bf16_file_path`: op lists apply to"),
        ({"precision": "32-true", "replace_layers": True}, r"takes no `replace_layers`.*to 'fp8'"),
        ({"precision": "bf16-mixed", "recipe": {"margin": 1}}, r"takes no `recipe`"),
        ({"precision": "fp8", "recipe": {"fp8_format": "E4M2"}}, r"`fp8_format='E4M2'` is not a format: use one of"),
    ],
)
def test_arguments_of_another_precision_are_refused(arguments, match):
    with pytest.raises(ValueError, match=match):
        HPUPrecisionPlugin(**arguments)


def test_a_class_refuses_the_precision_of_another():
    with pytest.raises(ValueError, match=r"`HPUMixedPrecision` runs 'bf16-mixed', '16-mixed', not `precision='fp8'`"):
        HPUMixedPrecision("fp8")
    with pytest.raises(
        ValueError, match=r"`HPUHalfPrecision` runs .*Use `HPUPrecisionPlugin\(precision='bf16-mixed'\)`"
    ):
        HPUHalfPrecision("bf16-mixed")


def test_a_trainer_refusing_its_flags_leaves_no_plugin_without_its_own_class():
    """A plugin given to the wrong strategy family is refused, naming the one to pass."""
    with pytest.raises(
        MisconfigurationException, match=r"HPUDeepSpeedPrecisionPlugin\(...\)\]` does not run on HPU without"
    ):
        pl.Trainer(accelerator="hpu", devices=1, plugins=[HPUDeepSpeedPrecisionPlugin("bf16-mixed")], logger=False)
    with pytest.raises(MisconfigurationException, match=r"Pass `HPUDeepSpeedPrecisionPlugin\(precision=...\)`"):
        pl.Trainer(accelerator="hpu", devices=1, strategy="hpu_deepspeed", plugins=[HPUMixedPrecision()], logger=False)


@pytest.mark.parametrize("fabric_class", ["lightning_fabric.Fabric", "lightning.Fabric"])
@pytest.mark.parametrize(
    ("plugin", "ours"),
    [(HPUMixedPrecision, "HPUPrecision"), (HPUDeepSpeedPrecisionPlugin, "HPUDeepSpeedPrecision")],
)
def test_fabric_refuses_the_trainers_plugins_naming_its_own(fabric_class, plugin, ours):
    """The Trainer's plugins derive from Fabric's but run the Trainer's hooks, which Fabric never calls."""
    module, name = fabric_class.rsplit(".", 1)
    fabric = getattr(importlib.import_module(module), name)
    strategy = "deepspeed" if "DeepSpeed" in ours else "auto"
    with pytest.raises(ValueError, match=rf"is the Trainer's precision plugin .* Pass `{ours}\(precision=...\)`"):
        fabric(accelerator="hpu", devices=1, strategy=strategy, plugins=[plugin("bf16-mixed")])


def test_building_a_plugin_changes_nothing_in_the_process(tmp_path, monkeypatch):
    # the lists the bridge read when it loaded, which the plugins name again
    monkeypatch.setenv("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", _mm_in_fp32(tmp_path)["bf16_file_path"])
    monkeypatch.setenv("PT_HPU_AUTOCAST_FP32_OPS_LIST", _mm_in_fp32(tmp_path)["fp32_file_path"])
    environment = dict(os.environ)
    HPUPrecisionPlugin(precision="bf16-mixed", **_mm_in_fp32(tmp_path))
    HPUPrecisionPlugin(precision="fp8", hmp_params={"bf16_ops": _mm_in_fp32(tmp_path)["bf16_file_path"]})
    assert dict(os.environ) == environment
    assert _mm_dtype() == torch.bfloat16
    # nor does a Trainer that refuses its flags
    plugin = HPUPrecisionPlugin(precision="bf16-mixed", **_mm_in_fp32(tmp_path))
    with pytest.raises(MisconfigurationException, match="runs on one HPU"):
        pl.Trainer(accelerator="hpu", devices=2, strategy="hpu_single", plugins=[plugin])
    assert dict(os.environ) == environment
    assert _mm_dtype() == torch.bfloat16


@pytest.mark.usefixtures("amx_host")
def test_fp8_by_constructor_converts_the_layers_when_the_model_is_set_up():
    from habana_frameworks.torch.hpex.experimental import transformer_engine as te

    model = BoringModel()
    plugin = HPUPrecisionPlugin(
        precision="fp8", recipe={"fp8_format": "HYBRID", "amax_history_len": 4}, replace_layers=True
    )
    assert type(model.layer) is torch.nn.Linear  # nothing happens before the run
    _trainer(plugin, max_steps=3).fit(model)
    assert isinstance(model.layer, te.Linear)
    state = model.layer.fp8_state.state_dict()
    assert state["amax_history"].shape[0] == 4 and state["steps"] >= 2
    assert plugin.recipe.fp8_format == te.recipe.Format.HYBRID


@RunIf(virtual_hpu=True)  # simulates first-generation Gaudi
def test_fp8_on_first_generation_gaudi_is_refused_and_reported_unavailable():
    code = (
        "from pytorch_lightning.plugins import HPUPrecisionPlugin\n"
        "p = HPUPrecisionPlugin('bf16-mixed')\n"
        "print('available', p.fp8_training_available, p.fp8_inference_available)\n"
        "HPUPrecisionPlugin('fp8')\n"
    )
    environment = {**os.environ, "VIRTUAL_HPU": "1", "VIRTUAL_HPU_GENERATION": "GAUDI"}
    result = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True)
    assert "available False False" in result.stdout
    assert result.returncode != 0 and "needs Gaudi2 or newer" in result.stderr
