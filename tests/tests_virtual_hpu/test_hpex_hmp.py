"""``habana_frameworks.torch.hpex.hmp`` (Lightning 1.x era mixed precision) mapped onto ``torch.autocast("hpu")``.

``hmp.convert`` turns bf16 mixed precision on for the rest of the process, so each case runs in a fresh interpreter.
"""

import pytest
from habana_frameworks.torch.hpex import hmp


@pytest.mark.parametrize("lazy", ["0", "1"], ids=["eager", "lazy"])
def test_convert_runs_the_listed_ops_in_bf16_and_fp32_until_casts_are_disabled(tmp_path, python, lazy):
    bf16, fp32 = tmp_path / "ops_bf16.txt", tmp_path / "ops_fp32.txt"
    bf16.write_text("linear\nrelu\n")
    fp32.write_text("cross_entropy\nsoftmax\n")
    result = python(
        f"""
        import torch  # activates the virtual Gaudi, which makes habana_frameworks importable
        import habana_frameworks.torch.core as htcore
        from habana_frameworks.torch.hpex import hmp
        hmp.convert(opt_level="O1", bf16_file_path={str(bf16)!r}, fp32_file_path={str(fp32)!r}, isVerbose=True)
        linear = torch.nn.Linear(4, 4).to("hpu")
        x = torch.randn(2, 4, device="hpu")
        y = linear(x)
        print("ops", y.dtype, torch.relu(x).dtype, torch.softmax(y, -1).dtype, torch.tanh(y).dtype)
        y.float().sum().backward()
        print("grad", linear.weight.grad.dtype)
        with hmp.disable_casts():
            print("disabled", linear(x).dtype)
        if not htcore.is_lazy():  # torch.compile runs in eager mode
            print("compiled", torch.compile(linear, backend="hpu_backend")(x).dtype)
        """,
        VIRTUAL_HPU="1",
        PT_HPU_LAZY_MODE=lazy,
    )
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    # listed ops in their list's type, unlisted ones (tanh) in their inputs' type
    assert lines["ops"] == "torch.bfloat16 torch.bfloat16 torch.float32 torch.bfloat16"
    assert lines["grad"] == "torch.float32"  # the weights stay fp32
    assert lines["disabled"] == "torch.float32"
    assert lines.get("compiled", "torch.bfloat16") == "torch.bfloat16"
    assert lines["hmp:"].startswith("opt_level O1, bf16 ops ['linear', 'relu'], fp32 ops ['cross_entropy_loss',")
    assert "removed in Gaudi software 1.13" in result.stderr


def test_o2_runs_matrix_products_in_bf16_and_keeps_the_fp32_list(python):
    result = python(
        """
        import torch
        from habana_frameworks.torch.hpex import hmp
        hmp.convert(opt_level="O2")
        x = torch.randn(3, 3, device="hpu")
        print((x @ x).dtype, torch.nn.functional.linear(x, x).dtype, torch.relu(x).dtype, torch.exp(x.bfloat16()).dtype)
        """,
        VIRTUAL_HPU="1",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["torch.bfloat16", "torch.bfloat16", "torch.float32", "torch.float32"]


def test_convert_refuses_unknown_levels_and_missing_files_before_changing_anything(tmp_path):
    import torch

    with pytest.raises(ValueError, match="opt_level='O3'"):
        hmp.convert(opt_level="O3")
    with pytest.raises(FileNotFoundError, match="bf16_file_path="):
        hmp.convert(bf16_file_path=str(tmp_path / "missing.txt"))
    assert not torch.is_autocast_enabled("hpu")


LIGHTNING_1X_SCRIPT = """
import torch
from habana_frameworks.torch.hpex import hmp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pytorch_lightning as pl

# as Gaudi scripts of the Lightning 1.x era did, before building the model
hmp.convert(opt_level="O1", bf16_file_path={bf16!r}, fp32_file_path={fp32!r}, isVerbose=False)


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.losses, self.logit_dtypes = [], set()

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.logit_dtypes.add(str(logits.dtype))
        loss = nn.functional.cross_entropy(logits, y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


torch.manual_seed(0)
x = torch.randn(64, 8)
y = (x[:, 0] > 0).long()
model = Classifier()
trainer = pl.Trainer(
    accelerator="hpu", devices=1, max_epochs=8, logger=False, enable_checkpointing=False, enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=16))
print("dtypes", sorted(model.logit_dtypes))
print("first", sum(model.losses[:4]) / 4, "last", sum(model.losses[-4:]) / 4)
print("weights", {{str(p.dtype) for p in model.parameters()}})
"""


@pytest.mark.parametrize("lazy", ["0", "1"], ids=["eager", "lazy"])
def test_a_lightning_1x_style_script_with_hmp_trains(tmp_path, python, lazy):
    bf16, fp32 = tmp_path / "ops_bf16.txt", tmp_path / "ops_fp32.txt"
    bf16.write_text("linear\nrelu\n")
    fp32.write_text("cross_entropy\n")
    script = LIGHTNING_1X_SCRIPT.format(bf16=str(bf16), fp32=str(fp32))
    result = python(script, script_dir=tmp_path, VIRTUAL_HPU="1", PT_HPU_LAZY_MODE=lazy)
    assert result.returncode == 0, result.stderr
    lines = {line.split(" ", 1)[0]: line for line in result.stdout.splitlines()}
    assert lines["dtypes"] == "dtypes ['torch.bfloat16']"
    assert lines["weights"] == "weights {'torch.float32'}"
    _, first, _, last = lines["first"].split()
    assert float(last) < 0.5 * float(first)
