"""Gaudi's op lists reach the bridge as Intel's bridge (1.19 and newer) reads them: from
``PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST`` / ``PT_HPU_AUTOCAST_FP32_OPS_LIST``, once, when it loads. Lists given to
the plugin before that are handed to it; after that they are refused with how to set them; no run switches Gaudi's
inference mode on (``htcore.hpu_set_env()``)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.exceptions import MisconfigurationException

import pytorch_lightning as pl
from pytorch_lightning.plugins import HPUPrecisionPlugin

_VARIABLES = ("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", "PT_HPU_AUTOCAST_FP32_OPS_LIST", "LOWER_LIST", "FP32_LIST")

# A training script whose lists keep ``linear`` in fp32 and put ``softmax`` in bf16 (Gaudi's defaults do the opposite).
# Each rank prints what the ops computed in. On a Gaudi in lazy mode (or with PT_HPU_AUTOLOAD=0) nothing loads the
# bridge before the Trainer looks at the HPUs; ``import pytorch_lightning`` activates the virtual Gaudi when
# VIRTUAL_HPU=1, so the script sets it only after building the plugin, then activates it as the Trainer would load the
# bridge. With "preset" the lists are in the environment before Python starts, and the bridge loads on `import torch`.
_SCRIPT = """
import json, os, sys
form, devices, lower, fp32 = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if form != "preset":
    os.environ.pop("VIRTUAL_HPU")
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
import pytorch_lightning as pl
from pytorch_lightning.plugins import HPUPrecisionPlugin

if form == "hmp_params":
    plugin = HPUPrecisionPlugin(precision=16, hmp_params={"level": "O1", "bf16_ops": lower, "fp32_ops": fp32})
else:
    plugin = HPUPrecisionPlugin("bf16-mixed", bf16_file_path=lower, fp32_file_path=fp32)
os.environ["VIRTUAL_HPU"] = "1"
import virtual_hpu

virtual_hpu.activate()


class Records(BoringModel):
    def training_step(self, batch, batch_idx):
        output = self.layer(batch)
        self.dtypes = {"linear": str(output.dtype), "softmax": str(torch.softmax(output, dim=-1).dtype)}
        return {"loss": self.loss(output.float())}


model = Records()
trainer = pl.Trainer(
    accelerator="hpu", devices=devices, plugins=[plugin], max_steps=2, limit_val_batches=0, logger=False,
    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
)
trainer.fit(model)
import habana_frameworks.torch.core as htcore

found = {"rank": trainer.global_rank, "inference_mode": htcore._inference_mode, **model.dtypes}
with open(f"result{trainer.global_rank}.json", "w") as file:
    json.dump(found, file)
"""


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
        ("hmp_params", 2, {"PT_HPU_AUTOLOAD": "0"}),
    ],
    ids=["lazy-1-hpu", "eager-autoload-off-2-hpus"],
)
def test_lists_given_before_the_bridge_loads_reach_it_in_every_rank(tmp_path, form, devices, env):
    results = _run(tmp_path, form, devices, **env)
    assert [found["rank"] for found in results] == list(range(devices))
    for found in results:
        assert found["linear"] == "torch.float32" and found["softmax"] == "torch.bfloat16", found
        assert not found["inference_mode"]


def test_lists_set_before_python_starts_apply_and_the_plugin_may_name_them(tmp_path):
    lower, fp32 = _lists(tmp_path)
    # eager mode, where `import torch` loads the bridge: the documented way
    (found,) = _run(
        tmp_path,
        "preset",
        1,
        PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST=lower,
        PT_HPU_AUTOCAST_FP32_OPS_LIST=fp32,
        PT_HPU_AUTOLOAD="1",
    )
    assert found["linear"] == "torch.float32" and found["softmax"] == "torch.bfloat16"


def test_lists_given_after_the_bridge_loaded_are_refused_naming_the_variables(tmp_path, monkeypatch):
    for variable in _VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    lower, fp32 = _lists(tmp_path)
    environment = dict(os.environ)
    with pytest.raises(MisconfigurationException, match="has loaded already") as refused:
        HPUPrecisionPlugin("bf16-mixed", bf16_file_path=lower, fp32_file_path=fp32)
    assert f"PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST={lower} PT_HPU_AUTOCAST_FP32_OPS_LIST={fp32} python" in str(
        refused.value
    )
    with pytest.raises(MisconfigurationException, match="PT_HPU_AUTOCAST_FP32_OPS_LIST unset"):
        HPUPrecisionPlugin(precision=16, hmp_params={"fp32_ops": fp32})
    # the other list differs from the one the bridge read
    monkeypatch.setenv("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", fp32)
    with pytest.raises(MisconfigurationException, match=r"PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST='.*fp32.txt'"):
        HPUPrecisionPlugin("bf16-mixed", bf16_file_path=lower)
    monkeypatch.delenv("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST")
    assert dict(os.environ) == environment


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
