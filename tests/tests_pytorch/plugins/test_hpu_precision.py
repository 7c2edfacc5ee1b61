"""HPU precision: autocast on the device, Gaudi's op lists in every form users pass them, and clear refusals."""

import logging
import os
import subprocess
import sys

import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

import pytorch_lightning as pl
from pytorch_lightning.plugins import HPUPrecisionPlugin
from tests_pytorch.helpers.runif import RunIf


@pytest.fixture(autouse=True)
def _no_op_lists_in_the_environment(monkeypatch):
    """Gaudi's bridge read no op lists when it loaded in this session: the environment names none (op lists given to
    a plugin are in ``test_hpu_op_lists.py``)."""
    for variable in ("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", "PT_HPU_AUTOCAST_FP32_OPS_LIST"):
        monkeypatch.delenv(variable, raising=False)


class DtypeRecordingModel(BoringModel):
    """Records the dtype of activations inside ``training_step``, with autocast on and locally off."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes = {}

    def training_step(self, batch, batch_idx):
        self.dtypes["input"], self.dtypes["weight"] = batch.dtype, self.layer.weight.dtype
        self.dtypes["created"] = torch.zeros(1, device=batch.device).dtype
        output = self.layer(batch)
        self.dtypes["linear"] = output.dtype
        self.dtypes["softmax"] = torch.softmax(output, dim=-1).dtype
        with torch.autocast("hpu", enabled=False):
            self.dtypes["linear_autocast_off"] = self.layer(batch).dtype
        return {"loss": self.loss(output)}


def _fit(precision=None, plugins=None) -> DtypeRecordingModel:
    model = DtypeRecordingModel()
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        precision=precision,
        plugins=plugins,
        max_steps=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    return model


@pytest.mark.parametrize(
    ("precision", "dtype"), [("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16), (16, torch.bfloat16)]
)
def test_mixed_precision_autocasts_in_training_step(precision, dtype):
    dtypes = _fit(precision).dtypes
    assert dtypes["linear"] == dtype
    # autocast can be switched off locally inside the model
    assert dtypes["linear_autocast_off"] == torch.float32


def test_legacy_16_is_bf16_mixed_on_every_gaudi(caplog, monkeypatch):
    # Lightning 1.x's `precision=16` on HPU: Habana mixed precision in bf16, said once in the log
    from lightning_fabric.plugins.precision import hpu

    monkeypatch.setattr(hpu, "_info_cache", type(hpu._info_cache)())
    with caplog.at_level(logging.INFO):
        assert HPUPrecisionPlugin(16).precision == HPUPrecisionPlugin("16").precision == "bf16-mixed"
    assert caplog.text.count("means bf16 mixed precision") == 1
    assert "precision='16-mixed'" in caplog.text


@RunIf(virtual_hpu=True)  # simulates first-generation Gaudi
def test_legacy_16_is_bf16_mixed_also_on_first_generation_gaudi():
    # which refuses float16
    code = (
        "import pytorch_lightning as pl\n"
        "trainer = pl.Trainer(accelerator='hpu', devices=1, precision=16, logger=False)\n"
        "print(trainer.precision_plugin.precision)"
    )
    environment = {**os.environ, "VIRTUAL_HPU": "1", "VIRTUAL_HPU_GENERATION": "GAUDI"}
    result = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True)
    assert result.stdout.split()[-1:] == ["bf16-mixed"], result.stderr


def test_true_precision_does_not_autocast():
    assert _fit("32-true").dtypes["linear"] == torch.float32


@pytest.mark.parametrize(("precision", "dtype"), [("bf16-true", torch.bfloat16), ("16-true", torch.float16)])
@pytest.mark.parametrize("by_plugin", [False, True], ids=["flag", "plugin"])
def test_half_precision_puts_weights_and_inputs_in_that_dtype(precision, dtype, by_plugin):
    model = _fit(plugins=[HPUPrecisionPlugin(precision)]) if by_plugin else _fit(precision)
    dtypes = model.dtypes
    assert dtypes["weight"] == dtypes["input"] == dtypes["created"] == dtypes["linear"] == dtype
    # without autocast, switching autocast off changes nothing
    assert dtypes["linear_autocast_off"] == dtype
    assert {p.dtype for p in model.parameters()} == {dtype}
    # the default dtype is only changed inside the step
    assert torch.get_default_dtype() == torch.float32


def test_half_precision_init_module():
    trainer = pl.Trainer(accelerator="hpu", devices=1, precision="bf16-true", logger=False)
    with trainer.init_module():
        model = BoringModel()
    assert model.layer.weight.dtype == torch.bfloat16


def _op_list(tmp_path, name, ops):
    path = tmp_path / name
    path.write_text("\n".join(ops) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"precision": "64-true"}, ValueError, "Gaudi has no float64"),
        ({"precision": "transformer-engine"}, ValueError, "not supported on HPU"),
        ({"precision": "bf16-mixed", "opt_level": "O2"}, ValueError, "Use `opt_level='O1'`"),
        ({"precision": "bf16-mixed", "hmp_params": {"levle": "O1"}}, ValueError, r"unknown keys \['levle'\]"),
        ({"precision": "bf16-mixed", "bf16_file_path": "/no/such/ops.txt"}, FileNotFoundError, "does not exist"),
        ({"precision": "bf16-mixed", "verbose": True, "hmp_params": {"verbose": False}}, ValueError, "pass one"),
    ],
)
def test_invalid_settings(kwargs, error, match):
    with pytest.raises(error, match=match):
        HPUPrecisionPlugin(**kwargs)


def test_unknown_op_names_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"ops that do not exist: 'lineer' \(did you mean 'linear'"):
        HPUPrecisionPlugin("bf16-mixed", bf16_file_path=_op_list(tmp_path, "bf16.txt", ["linear", "lineer"]))


def test_upstream_mixed_precision_for_hpu_is_accepted(tmp_path):
    """lightning-habana accepted ``MixedPrecision(..., device="hpu")`` in ``plugins``; it trains in bf16 autocast."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    class RecordsDtype(BoringModel):
        def training_step(self, batch, batch_idx):
            out = self.layer(batch)
            self.activation_dtype = out.dtype
            return out.float().sum()

    model = RecordsDtype()
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        plugins=[MixedPrecision("bf16-mixed", device="hpu")],
        max_steps=1,
        default_root_dir=tmp_path,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(model)
    assert isinstance(trainer.precision_plugin, HPUPrecisionPlugin)
    assert trainer.precision_plugin.precision == "bf16-mixed"
    assert model.activation_dtype == torch.bfloat16


def test_op_list_files_take_gaudi_names_and_name_the_closest_for_a_typo(tmp_path, monkeypatch):
    lower, fp32 = tmp_path / "lower.txt", tmp_path / "fp32.txt"
    lower.write_text("linear\nmatmul\n")
    fp32.write_text("# Lightning 1.x's example list\ncross_entropy\nlog_softmax\nnll_loss\ntruediv\n")
    # as in a process started with these lists set
    monkeypatch.setenv("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", str(lower))
    monkeypatch.setenv("PT_HPU_AUTOCAST_FP32_OPS_LIST", str(fp32))
    HPUPrecisionPlugin("bf16-mixed", bf16_file_path=str(lower), fp32_file_path=str(fp32))
    lower.write_text("lienar\n")
    with pytest.raises(ValueError, match=r"`bf16_file_path`.*'lienar' \(did you mean 'linear'"):
        HPUPrecisionPlugin("bf16-mixed", bf16_file_path=str(lower))
