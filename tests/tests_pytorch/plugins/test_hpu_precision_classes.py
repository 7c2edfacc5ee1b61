"""The HPU precision classes: one per precision, built by ``HPUPrecisionPlugin(precision=...)`` and the flag, and
configured by their constructor alone: building one changes nothing in the process; a run installs its settings and
puts the process back as it was when it ends, also when it fails."""

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

_VARIABLES = ("LOWER_LIST", "FP32_LIST", "PT_HPU_LAZY_MODE")


@pytest.fixture(autouse=True)
def _op_lists_of_the_environment():
    """Start from the default op lists, and leave them so."""
    import habana_frameworks.torch.core as htcore

    saved = {variable: os.environ.pop(variable, None) for variable in _VARIABLES}
    htcore.hpu_set_env()
    os.environ.pop("PT_HPU_LAZY_MODE", None)
    yield
    for variable, value in saved.items():
        os.environ.pop(variable, None)
        if value is not None:
            os.environ[variable] = value
    htcore.hpu_set_env()
    if saved["PT_HPU_LAZY_MODE"] is None:  # hpu_set_env also records the execution mode there, as on Gaudi
        os.environ.pop("PT_HPU_LAZY_MODE")


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
    # the attributes lightning-habana's users read
    assert plugin.device == "hpu"
    assert plugin.fp8_training_available is True and plugin.fp8_inference_available is True


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


def test_building_a_plugin_changes_nothing_in_the_process(tmp_path):
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


class RecordsMm(BoringModel):
    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail

    def training_step(self, batch, batch_idx):
        self.mm_dtype = _mm_dtype()
        if self.fail:
            raise RuntimeError("a step fails")
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("fail", [False, True])
def test_a_run_installs_the_op_lists_and_restores_them_when_it_ends(tmp_path, fail):
    user_lower = tmp_path / "user_lower.txt"
    user_lower.write_text("softmax\n")
    os.environ["LOWER_LIST"] = str(user_lower)  # the user's own list, in force before and after: mm in the input type
    import habana_frameworks.torch.core as htcore

    htcore.hpu_set_env()
    os.environ.pop("PT_HPU_LAZY_MODE", None)
    before = dict(os.environ)
    assert _mm_dtype() == torch.float32
    model = RecordsMm(fail)
    first = HPUPrecisionPlugin(precision="bf16-mixed", **_mm_in_fp32(tmp_path))
    (tmp_path / "second.txt").write_text("mm\n")
    second = HPUPrecisionPlugin(precision="bf16-mixed", bf16_file_path=str(tmp_path / "second.txt"))
    for plugin, dtype_in_run in [(first, torch.float32), (second, torch.bfloat16)]:
        if fail:
            with pytest.raises(RuntimeError, match="a step fails"):
                _trainer(plugin).fit(model)
        else:
            _trainer(plugin).fit(model)
        assert model.mm_dtype == dtype_in_run
        assert dict(os.environ) == before
        assert _mm_dtype() == torch.float32


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
