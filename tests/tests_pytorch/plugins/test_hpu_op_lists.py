"""Op lists given to the plugin take effect on today's bridge. Gaudi's bridge reads its lists from
``PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST`` / ``PT_HPU_AUTOCAST_FP32_OPS_LIST`` once, when it loads (``import torch``
in eager mode); the plugin puts the lists given to it in force at torch's dispatcher for the length of its autocast, in
eager mode (compiled or not) and lazy mode, and the bridge's lists are back after it. No run switches Gaudi's inference
mode on (``htcore.hpu_set_env()``)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

import pytorch_lightning as pl
from lightning_fabric.plugins.precision import hpu_op_lists
from pytorch_lightning.plugins import HPUPrecisionPlugin

_VARIABLES = ("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", "PT_HPU_AUTOCAST_FP32_OPS_LIST", "LOWER_LIST", "FP32_LIST")

# A training script whose lists keep ``linear`` in fp32 and put ``softmax`` and ``mm`` in lower precision (Gaudi's
# defaults do the opposite for the first two), and leave out ``exp`` (fp32 by default: now it runs in its input's
# type). `import torch` has loaded the bridge (the virtual Gaudi with VIRTUAL_HPU=1) before the plugin is built, as in
# every script; with "preset" the lists are in the environment before Python starts instead. The ops run in
# ``forward``, which "compiled" compiles with Gaudi's backend. Each rank writes what the ops computed in.
_SCRIPT = """
import json, sys
form, devices, lower, fp32 = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
import pytorch_lightning as pl
from pytorch_lightning.plugins import HPUPrecisionPlugin

if form == "hmp_params":
    plugin = HPUPrecisionPlugin(precision=16, hmp_params={"level": "O1", "bf16_ops": lower, "fp32_ops": fp32})
elif form == "preset":
    plugin = HPUPrecisionPlugin("bf16-mixed")
else:
    plugin = HPUPrecisionPlugin("bf16-mixed", bf16_file_path=lower, fp32_file_path=fp32)


class Records(BoringModel):
    def forward(self, x):
        output = self.layer(x)
        square = x.float() @ x.float().t()
        return output, torch.softmax(output, dim=-1), torch.mm(square, square), torch.exp(output.bfloat16())

    def training_step(self, batch, batch_idx):
        outputs = self(batch)
        self.dtypes = dict(zip(("linear", "softmax", "mm", "exp"), (str(output.dtype) for output in outputs)))
        return {"loss": self.loss(outputs[0].float())}


model = Records()
trainer = pl.Trainer(
    accelerator="hpu", devices=devices, plugins=[plugin], max_steps=2, limit_val_batches=0, logger=False,
    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
)
trainer.fit(torch.compile(model, backend="hpu_backend") if form == "compiled" else model)
import habana_frameworks.torch.core as htcore

found = {"rank": trainer.global_rank, "inference_mode": htcore._inference_mode, **model.dtypes}
with open(f"result{trainer.global_rank}.json", "w") as file:
    json.dump(found, file)
"""

_GIVEN = {"linear": "torch.float32", "softmax": "torch.bfloat16", "mm": "torch.bfloat16", "exp": "torch.bfloat16"}


def _lists(tmp_path):
    lower, fp32 = tmp_path / "lower.txt", tmp_path / "fp32.txt"
    lower.write_text("softmax\nmm\n")
    fp32.write_text("linear\n")
    return str(lower), str(fp32)


def _run(tmp_path, form: str, devices: int, **env: str) -> list[dict]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    lower, fp32 = _lists(tmp_path)
    environment = {k: v for k, v in os.environ.items() if k not in _VARIABLES and not k.startswith("PT_HPU")}
    environment.update(VIRTUAL_HPU="1", **env)
    result = subprocess.run(
        [sys.executable, str(script), form, str(devices), lower, fp32],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    output = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0, output
    # each rank writes what it found to a file of its own: their printed lines can interleave
    found = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("result*.json"))]
    assert found, output
    return sorted(found, key=lambda one: one["rank"])


@pytest.mark.parametrize(
    ("form", "devices", "env"),
    [
        ("arguments", 1, {"PT_HPU_LAZY_MODE": "1"}),
        ("compiled", 1, {"PT_HPU_LAZY_MODE": "0"}),
        pytest.param("hmp_params", 2, {"PT_HPU_LAZY_MODE": "0"}, marks=pytest.mark.heavy),
    ],
    ids=["lazy-1-hpu", "compiled-1-hpu", "eager-hmp-params-2-hpus"],
)
def test_lists_given_after_the_bridge_loaded_take_effect_in_every_rank(tmp_path, form, devices, env):
    results = _run(tmp_path, form, devices, **env)
    assert [found["rank"] for found in results] == list(range(devices))
    for found in results:
        assert {op: found[op] for op in _GIVEN} == _GIVEN, found
        assert not found["inference_mode"]


def test_lists_set_before_python_starts_apply(tmp_path):
    lower, fp32 = _lists(tmp_path)
    (found,) = _run(
        tmp_path,
        "preset",
        1,
        PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST=lower,
        PT_HPU_AUTOCAST_FP32_OPS_LIST=fp32,
    )
    assert {op: found[op] for op in _GIVEN} == _GIVEN, found


class _MnistOps(BoringModel):
    """Runs each op of the lists of Lightning 1.9's MNIST example of op lists and records the type it computed in."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: dict[str, torch.dtype] = {}

    def training_step(self, batch, batch_idx):
        # fp32 inputs, but bf16 ones for the losses: a list's effect shows either way
        target = torch.zeros(len(batch), dtype=torch.long, device=batch.device)
        outputs = {
            "linear": self.layer(batch),
            "relu": torch.relu(batch),
            "softmax": torch.softmax(batch, dim=-1),
            "log_softmax": torch.log_softmax(batch, dim=-1),
            "nll_loss": torch.nn.functional.nll_loss(batch.bfloat16(), target),
            "cross_entropy": torch.nn.functional.cross_entropy(batch.bfloat16(), target),
        }
        self.dtypes = {op: output.dtype for op, output in outputs.items()}
        return self.loss(outputs["linear"].float())


def _fit(plugin, model: BoringModel, tmp_path) -> None:
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        plugins=[plugin],
        max_steps=2,
        limit_val_batches=0,
        default_root_dir=tmp_path,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)


def test_lightning_19s_example_trains_each_listed_op_in_its_lists_precision(tmp_path, monkeypatch):
    for variable in _VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "ops_bf16_mnist.txt").write_text("linear\nrelu\n")
    (tmp_path / "ops_fp32_mnist.txt").write_text("cross_entropy\nlog_softmax\nsoftmax\nnll_loss\n")
    monkeypatch.chdir(tmp_path)
    # the documented form of Lightning 1.9, after `import torch` loaded the bridge
    plugin = HPUPrecisionPlugin(
        precision=16,
        opt_level="O1",
        verbose=False,
        bf16_file_path="ops_bf16_mnist.txt",
        fp32_file_path="ops_fp32_mnist.txt",
    )
    model = _MnistOps()
    _fit(plugin, model, tmp_path)
    lower = {op: torch.bfloat16 for op in ("linear", "relu")}
    fp32 = {op: torch.float32 for op in ("softmax", "log_softmax", "nll_loss", "cross_entropy")}
    assert model.dtypes == {**lower, **fp32}


def test_lists_change_between_two_fits_in_one_process_and_the_bridges_are_back_after(tmp_path, monkeypatch):
    for variable in _VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    fp32_linear, lower_softmax, lower_linear = tmp_path / "fp32.txt", tmp_path / "softmax.txt", tmp_path / "lower.txt"
    fp32_linear.write_text("linear\n")
    lower_softmax.write_text("softmax\n")
    lower_linear.write_text("linear\nexp\n")
    first, second = _MnistOps(), _MnistOps()
    _fit(
        HPUPrecisionPlugin("bf16-mixed", bf16_file_path=str(lower_softmax), fp32_file_path=str(fp32_linear)),
        first,
        tmp_path,
    )
    _fit(HPUPrecisionPlugin("bf16-mixed", bf16_file_path=str(lower_linear)), second, tmp_path)
    # the first's lists replaced both of the bridge's (nll_loss now runs in its input's type); the second's replaced
    # the lower list only (softmax now runs in its input's type, nll_loss still in fp32)
    found = [(model.dtypes["linear"], model.dtypes["softmax"], model.dtypes["nll_loss"]) for model in (first, second)]
    assert found == [(torch.float32, torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32, torch.float32)]
    x = torch.randn(4, 32, device="hpu")
    with torch.autocast("hpu", dtype=torch.bfloat16):
        # Gaudi's default lists again: linear and softmax lower, exp fp32
        found = (torch.nn.functional.linear(x, x).dtype, torch.softmax(x, -1).dtype, torch.exp(x.bfloat16()).dtype)
    assert found == (torch.bfloat16, torch.bfloat16, torch.float32)


def test_a_plugin_without_lists_registers_nothing(tmp_path, monkeypatch):
    for variable in _VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    built = []
    monkeypatch.setattr(torch.library, "Library", lambda *args, **kwargs: built.append(args))
    plugin = HPUPrecisionPlugin("bf16-mixed")
    assert not plugin.op_lists.given
    _fit(plugin, _MnistOps(), tmp_path)
    assert built == []


def test_a_list_given_in_code_is_checked_when_the_plugin_is_built(tmp_path):
    lists = tmp_path / "lower.txt"
    lists.write_text("linear\nsoftmaks\n")
    with pytest.raises(ValueError, match=r"'softmaks' \(did you mean 'softmax'"):
        HPUPrecisionPlugin("bf16-mixed", bf16_file_path=str(lists))
    with pytest.raises(ValueError, match=r"'lienar' \(did you mean 'linear'"):
        hpu_op_lists.HPUAutocastOpLists(fp32=["lienar"])


class _RecordsInferenceMode(BoringModel):
    def training_step(self, batch, batch_idx):
        import habana_frameworks.torch.core as htcore

        self.inference_mode = htcore._inference_mode
        return super().training_step(batch, batch_idx)


def test_a_run_with_op_lists_never_switches_inference_mode_on(tmp_path, monkeypatch):
    import habana_frameworks.torch.core as htcore

    lower, fp32 = _lists(tmp_path)
    # the lists the bridge read when it loaded (as the environment of a rank its launcher started says)
    monkeypatch.setenv("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", lower)
    monkeypatch.setenv("PT_HPU_AUTOCAST_FP32_OPS_LIST", fp32)
    calls = []
    monkeypatch.setattr(htcore, "hpu_set_env", lambda *args, **kwargs: calls.append(args))
    environment = dict(os.environ)
    plugin = HPUPrecisionPlugin("bf16-mixed", bf16_file_path=lower, fp32_file_path=fp32, verbose=True)
    assert plugin.op_list_files == {
        "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST": lower,
        "PT_HPU_AUTOCAST_FP32_OPS_LIST": fp32,
    }
    model = _RecordsInferenceMode()
    trainer = pl.Trainer(
        accelerator="hpu", devices=1, plugins=[plugin], max_steps=1, default_root_dir=tmp_path, logger=False
    )
    trainer.fit(model)
    trainer.predict(model, dataloaders=model.val_dataloader())
    assert calls == [] and model.inference_mode is False and not htcore._inference_mode
    assert dict(os.environ) == environment


def test_the_older_names_alone_are_named_as_not_read_by_current_software(tmp_path, monkeypatch):
    for variable in _VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    lower, _ = _lists(tmp_path)
    monkeypatch.setenv("LOWER_LIST", lower)
    with pytest.warns(UserWarning, match="LOWER_LIST is set but Gaudi software 1.19 and newer reads"):
        plugin = HPUPrecisionPlugin("bf16-mixed")
    assert plugin.op_list_files["PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"] is None
    assert torch.get_default_dtype() == torch.float32
