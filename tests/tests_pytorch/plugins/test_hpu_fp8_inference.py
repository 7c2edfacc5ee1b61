"""fp8 inference with Intel Neural Compressor: measure in one process, quantize in another; configurations; bad
inputs."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.exceptions import MisconfigurationException

import pytorch_lightning as pl
from lightning_fabric.plugins.precision import _fp8_inference as hpu_fp8_inference
from pytorch_lightning.plugins import HPUDeepSpeedPrecisionPlugin, HPUPrecisionPlugin
from tests_pytorch.helpers.runif import variants

pytest.importorskip("neural_compressor.torch.quantization")

EXAMPLES = Path(__file__).parents[3] / "examples" / "pytorch"
PACKAGED = sorted(Path(hpu_fp8_inference.__file__).parent.joinpath("fp8_configs").glob("*.json"))


def _digests(paths) -> dict:
    return {str(path): hashlib.sha256(Path(path).read_bytes()).hexdigest() for path in paths}


def _run(arguments: list, cwd: Path, **environment: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "QUANT_CONFIG"}
    env.update(VIRTUAL_HPU="1", **environment)
    result = subprocess.run([sys.executable, *arguments], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.parametrize("lazy", variants(["0", "1"], kept=["0"]))
def test_measure_then_quantize_the_demo_in_new_processes(tmp_path, lazy):
    """The worked example: train in bf16, measure on the validation set, quantize in a third process and test."""
    packaged = _digests(PACKAGED)
    script = str(EXAMPLES / "hpu_fp8_inference.py")
    for step in ("train", "measure", "quantize"):
        _run([script, step, "--workdir", str(tmp_path), "--max-epochs", "4"], cwd=tmp_path, PT_HPU_LAZY_MODE=lazy)
        if step == "measure":
            written = {path.name for path in (tmp_path / "hqt_output").iterdir()}
            assert {"measure_hooks_maxabs.npz", "measure_hooks_maxabs.json"} <= written
    results = json.loads((tmp_path / "fp8_inference.json").read_text())
    # accuracy within one point of bf16's on the same weights (measured: 0.9740 vs 0.9777 after 6 epochs)
    assert results["bf16_test_acc"] >= 0.90
    assert abs(results["fp8_test_acc"] - results["bf16_test_acc"]) <= 0.01, results
    # predictions: the same class for >= 98 % of the test images, logits within 6 % of the largest (measured 3 %)
    assert results["same_prediction"] >= 0.98, results
    assert 0 < results["max_logit_difference"] <= 0.06 * results["max_logit"], results
    assert _digests(PACKAGED) == packaged


_SMALL_MODEL = """
import os, sys, json, torch
import pytorch_lightning as pl
from lightning.pytorch.demos.boring_classes import BoringModel
from pytorch_lightning.plugins import HPUPrecisionPlugin

class Model(BoringModel):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))

    def predict_step(self, batch, batch_idx):
        return self(batch)

def model():
    torch.manual_seed(0)
    return Model()

def predict(model, plugin):
    trainer = pl.Trainer(accelerator="hpu", devices=1, plugins=[plugin], logger=False, enable_progress_bar=False)
    return torch.cat(trainer.predict(model, dataloaders=model.predict_dataloader())).float().cpu()
"""


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "run.py"
    path.write_text(_SMALL_MODEL + textwrap.dedent(body))
    return str(path)


@pytest.mark.heavy
def test_user_json_configurations_are_read_never_written(tmp_path):
    """``QUANT_CONFIG`` names the measurement JSON (its ``dump_stats_path`` places the statistics), ``quant=<path>``
    the quantization JSON; both files and the packaged ones are byte-identical afterwards."""
    measure = tmp_path / "measure.json"
    measure.write_text(json.dumps({"mode": "MEASURE", "observer": "maxabs", "dump_stats_path": "./stats/calib"}))
    quantize = tmp_path / "quant.json"
    quantize.write_text(json.dumps({"mode": "QUANTIZE", "scale_method": "maxabs_hw", "dump_stats_path": "stats/calib"}))
    files = [measure, quantize, *PACKAGED]
    before = _digests(files)
    # quant=True (the default) is overridden by the JSON's mode
    _run(
        [_script(tmp_path, "p = HPUPrecisionPlugin('fp8'); predict(p.convert_modules(model(), inference=True), p)")],
        cwd=tmp_path,
        QUANT_CONFIG=str(measure),
    )
    assert (tmp_path / "stats" / "calib_hooks_maxabs.npz").is_file()
    result = _run(
        [
            _script(
                tmp_path,
                f"""
            reference = predict(model(), HPUPrecisionPlugin('bf16-mixed'))
            p = HPUPrecisionPlugin('fp8')
            quantized = predict(p.convert_modules(model(), inference=True, quant={str(quantize)!r}), p)
            print('difference', (quantized - reference).abs().max().item(), reference.abs().max().item())
            """,
            )
        ],
        cwd=tmp_path,
    )
    difference, largest = map(float, result.stdout.split("difference ")[1].split())
    # e4m3 keeps 3 mantissa bits (steps of 1/8 to 1/16 relative); outputs of random inputs cancel a lot (measured 6.5 %)
    assert 0 < difference <= 0.1 * largest
    assert _digests(files) == before


def test_measuring_and_quantizing_in_one_process_is_refused(tmp_path):
    result = _run(
        [
            _script(
                tmp_path,
                f"""
        p = HPUPrecisionPlugin('fp8')
        predict(p.convert_modules(model(), inference=True, quant=False, fp8_data_path={str(tmp_path)!r}), p)
        try:
            HPUPrecisionPlugin('fp8').convert_modules(model(), inference=True, fp8_data_path={str(tmp_path)!r})
        except Exception as error:
            print('refused:', error)
        """,
            )
        ],
        cwd=tmp_path,
    )
    assert "refused: This process has already measured a model for fp8 inference and cannot quantize" in result.stdout


@pytest.mark.heavy
def test_a_failed_measurement_leaves_the_statistics_folder_as_it_was(tmp_path):
    """Intel Neural Compressor moves earlier statistics aside when a measurement starts; ours reach ``fp8_data_path``
    only when the stage succeeds, and earlier ones of the same names are kept in a backup folder then."""
    folder, staging = tmp_path / "fp8", tmp_path / "tmp"
    staging.mkdir()
    measure = f"""
        def measure(cls):
            p = HPUPrecisionPlugin('fp8')
            torch.manual_seed(0)
            predict(p.convert_modules(cls(), inference=True, quant=False, fp8_data_path={str(folder)!r}), p)
        """
    _run([_script(tmp_path, measure + "measure(Model)")], cwd=tmp_path, TMPDIR=str(staging))
    first = _digests(sorted(folder.iterdir()))
    assert len(first) == 3 and all(Path(path).name.startswith("measure_hooks_maxabs") for path in first)
    failing = """
        class Failing(Model):
            def predict_step(self, batch, batch_idx):
                if batch_idx == 2:
                    raise RuntimeError("data error")
                return self(batch)
        try:
            measure(Failing)
        except RuntimeError as error:
            print(error)
        """
    result = _run([_script(tmp_path, measure + failing)], cwd=tmp_path, TMPDIR=str(staging))
    assert "data error" in result.stdout
    assert _digests(sorted(folder.iterdir())) == first
    _run([_script(tmp_path, measure + "measure(Model)")], cwd=tmp_path, TMPDIR=str(staging))
    (backup,) = folder.glob("backup_measure_*")
    assert _digests(sorted(backup.iterdir())) == {str(backup / Path(path).name): d for path, d in first.items()}
    assert sorted(path.name for path in folder.glob("measure_hooks_*")) == sorted(Path(path).name for path in first)
    # the staging folders are gone when the processes end
    assert not list(staging.glob("fp8-measurement-*"))


def _write(path: Path, content: dict) -> str:
    path.write_text(json.dumps(content))
    return str(path)


@pytest.mark.parametrize(
    ("arguments", "environment", "match"),
    [
        (
            {"quant": {"mode": "QUANTIZE", "obsrever": "maxabs"}},
            {},
            "keys Intel Neural Compressor does not know: obsrever",
        ),
        ({"quant": {"mode": "AUTO"}}, {}, "has `mode='AUTO'`. fp8 inference runs in two steps"),
        ({"quant": 1.5}, {}, "`quant` is True .quantize., False .measure., the path"),
        ({}, {"QUANT_CONFIG": "missing.json"}, "`QUANT_CONFIG=missing.json`: no such file"),
        ({"quant": "missing.json"}, {}, "`quant='missing.json'`: no such file"),
        ({"quant": True}, {}, "fp8 quantization reads the measurements in .*, and there are none. Measure first"),
    ],
)
def test_bad_inputs_are_refused_before_anything_changes(tmp_path, monkeypatch, arguments, environment, match):
    monkeypatch.delenv("QUANT_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    plugin = HPUPrecisionPlugin("fp8")
    model = BoringModel()
    with pytest.raises(MisconfigurationException, match=match):
        plugin.convert_modules(model, inference=True, fp8_data_path=str(tmp_path / "fp8"), **arguments)
    assert type(model.layer) is torch.nn.Linear and plugin.fp8_inference(model) is None
    assert list(tmp_path.iterdir()) == []


def test_a_statistics_folder_that_cannot_be_written_is_refused_before_measuring(tmp_path):
    (tmp_path / "notes.txt").write_text("")
    plugin = HPUPrecisionPlugin("fp8")
    model = BoringModel()
    with pytest.raises(MisconfigurationException, match="notes.txt is not a writable folder. Pass a writable folder"):
        plugin.convert_modules(model, inference=True, quant=False, fp8_data_path=str(tmp_path / "notes.txt" / "fp8"))
    assert type(model.layer) is torch.nn.Linear and plugin.fp8_inference(model) is None


def test_data_parallel_inference_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(hpu_fp8_inference, "_mode_of_this_process", None)  # this test's measurement stays its own
    plugin = HPUPrecisionPlugin("fp8")
    model = plugin.convert_modules(BoringModel(), inference=True, quant=False, fp8_data_path=str(tmp_path))
    trainer = pl.Trainer(accelerator="hpu", devices=2, strategy="hpu_parallel", plugins=[plugin], logger=False)
    with pytest.raises(MisconfigurationException, match="not supported with `strategy='hpu_parallel'`.*'hpu_single'"):
        trainer.strategy.connect(model)


@pytest.mark.parametrize("stage", variants([2, 3], kept=[3]))
def test_deepspeed_quantized_inference(tmp_path, stage):
    """Under DeepSpeed the quantized model runs with ZeRO stages 0-2; stage 3 cannot partition fp8 weights."""
    pytest.importorskip("deepspeed")
    body = f"""
        from pytorch_lightning.plugins import HPUDeepSpeedPrecisionPlugin
        from pytorch_lightning.strategies import HPUDeepSpeedStrategy
        step = sys.argv[1]
        p = HPUDeepSpeedPrecisionPlugin('fp8')
        path = {str(tmp_path / "fp8")!r}
        m = p.convert_modules(model(), inference=True, quant=step == 'quantize', fp8_data_path=path)
        trainer = pl.Trainer(accelerator="hpu", devices=1, strategy=HPUDeepSpeedStrategy(stage={stage}), plugins=[p],
                             logger=False, enable_progress_bar=False)
        try:
            out = torch.cat(trainer.predict(m, dataloaders=m.predict_dataloader()))
            print('predicted', tuple(out.shape), type(m.layer[0]).__name__)
        except Exception as error:
            print('refused:', error)
        """
    script = _script(tmp_path, body)
    _run([script, "measure"], cwd=tmp_path, MASTER_PORT=str(_free_port()))
    result = _run([script, "quantize"], cwd=tmp_path, MASTER_PORT=str(_free_port()))
    if stage == 3:
        assert "refused: ZeRO stage 3 partitions the model's parameters" in result.stdout
    else:
        assert "predicted (64, 2) PatchedLinear" in result.stdout, result.stdout


def _free_port() -> int:
    from tests_pytorch.helpers.processes import free_port

    return free_port()


def test_deepspeed_plugin_takes_the_same_inference_arguments(tmp_path, monkeypatch):
    monkeypatch.delenv("QUANT_CONFIG", raising=False)
    with pytest.raises(MisconfigurationException, match="and there are none"):
        HPUDeepSpeedPrecisionPlugin("fp8").convert_modules(BoringModel(), inference=True, fp8_data_path=str(tmp_path))


def test_measurements_of_another_number_of_processes_are_named(tmp_path, monkeypatch):
    monkeypatch.delenv("QUANT_CONFIG", raising=False)
    (tmp_path / "measure_hooks_maxabs_3_4.json").write_text("{}")
    with pytest.raises(MisconfigurationException, match=r"which has measure_hooks_maxabs_3_4.json: .* another number"):
        HPUPrecisionPlugin("fp8").convert_modules(BoringModel(), inference=True, fp8_data_path=str(tmp_path))


def test_a_measured_model_run_without_its_plugin_still_gets_its_statistics_written(tmp_path):
    """lightning-habana's spelling with the plugin left out of the Trainer: the Trainer's own HPU plugin writes them."""
    folder = tmp_path / "fp8"
    body = f"""
        p = HPUPrecisionPlugin('fp8')
        m = p.convert_modules(model(), inference=True, quant=False, fp8_data_path={str(folder)!r})
        trainer = pl.Trainer(accelerator="hpu", devices=1, logger=False, enable_progress_bar=False)
        trainer.test(m, dataloaders=m.val_dataloader(), verbose=False)
        print('plugin', type(trainer.precision_plugin).__name__)
        """
    result = _run([_script(tmp_path, body)], cwd=tmp_path)
    assert "plugin HPUPrecisionPlugin" in result.stdout
    assert sorted(path.name for path in folder.iterdir()) == [
        "measure_hooks_maxabs.json",
        "measure_hooks_maxabs.npz",
        "measure_hooks_maxabs_mod_list.json",
    ]


def test_fp8_inference_by_constructor_measures_then_quantizes_at_set_up(tmp_path):
    """``HPUFP8InferencePrecision``: the Trainer sets the model up for measurement, then in a new process quantizes it;
    the quantized predictions stay close to the measured model's bf16 ones."""
    body = f"""
        from pytorch_lightning.plugins import HPUFP8InferencePrecision
        plugin = HPUFP8InferencePrecision(quant=sys.argv[1] == 'quantize', fp8_data_path={str(tmp_path / "fp8")!r})
        m = model()
        assert type(m.layer[0]) is torch.nn.Linear  # nothing happens before the run
        out = predict(m, plugin)
        torch.save(out, sys.argv[1] + '.pt')
        print('prepared', type(m.layer[0]).__name__, type(m.layer[2]).__name__)
        """
    script = _script(tmp_path, body)
    measured = _run([script, "measure"], cwd=tmp_path)
    assert "prepared PatchedLinear PatchedLinear" in measured.stdout
    assert (tmp_path / "fp8" / "measure_hooks_maxabs.npz").is_file()
    quantized = _run([script, "quantize"], cwd=tmp_path)
    assert "prepared PatchedLinear PatchedLinear" in quantized.stdout
    bf16, fp8 = torch.load(tmp_path / "measure.pt"), torch.load(tmp_path / "quantize.pt")
    assert not torch.equal(bf16, fp8)
    assert (fp8 - bf16).abs().max() <= 0.1 * bf16.abs().max()


_FABRIC_INFERENCE = """
import sys, torch
import lightning as L
from lightning_fabric.plugins import HPUFP8InferencePrecision

plugin = HPUFP8InferencePrecision(quant=sys.argv[1] == 'quantize', fp8_data_path=sys.argv[2])
fabric = L.Fabric(accelerator="hpu", devices=1, plugins=[plugin])
torch.manual_seed(0)
model = fabric.setup_module(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)))
with torch.no_grad():
    out = torch.cat([model(fabric.to_device(torch.randn(8, 32))) for _ in range(4)]).float().cpu()
fabric.strategy.teardown()  # the run ends: a measurement is written
torch.save(out, sys.argv[1] + '.pt')
print('prepared', type(model.module[0]).__name__)
"""


@pytest.mark.heavy
def test_fabric_measures_then_quantizes_with_its_plugin(tmp_path):
    """Fabric's ``HPUFP8InferencePrecision``: ``setup_module`` prepares the model, the strategy's teardown writes the
    measurements, a later process quantizes from them."""
    script = tmp_path / "fabric_fp8.py"
    script.write_text(_FABRIC_INFERENCE)
    folder = str(tmp_path / "fp8")
    measured = _run([str(script), "measure", folder], cwd=tmp_path)
    assert "prepared PatchedLinear" in measured.stdout
    assert (tmp_path / "fp8" / "measure_hooks_maxabs.npz").is_file()
    quantized = _run([str(script), "quantize", folder], cwd=tmp_path)
    assert "prepared PatchedLinear" in quantized.stdout
    bf16, fp8 = torch.load(tmp_path / "measure.pt"), torch.load(tmp_path / "quantize.pt")
    assert not torch.equal(bf16, fp8)
    assert (fp8 - bf16).abs().max() <= 0.1 * bf16.abs().max()
