"""Gaudi's tools for dynamic shapes on the virtual device: which modules recompile and why, and the input shapes of a
data loader. The recompilation report needs graphs per module, so it runs in lazy mode, in a process of its own."""

RECOMPILING_MODEL = """
import os
import torch
from habana_frameworks.torch.utils.experimental import detect_recompilation_auto_model

class Inner(torch.nn.Module):
    def __init__(self, dynamic):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, 3, 3)
        self.dynamic = dynamic

    def forward(self, x):
        x = torch.flatten(self.conv(x), 1)
        # boolean indexing: the output shape depends on the data
        x = x[x > 0] if self.dynamic else torch.where(x > 0, x, torch.zeros_like(x))
        return x.sum()

for dynamic in (True, False):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.ReLU(), Inner(dynamic)).to("hpu")
    # as Intel's tests call it
    csv_out = os.path.join(os.path.dirname(__file__), str(dynamic))
    net = detect_recompilation_auto_model(net, mdlname="Net", waittime=0.3, csv_out=csv_out)
    for batch in (20, 20, 30, 30):  # the input shape changes at the third step
        net(torch.rand(batch, 1, 50, 50).to("hpu"))
    report = net.analyse_dynamicity()
    print("REPORT", dynamic, sorted({(r["step"], r["module"], r["new_input_shapes"]) for r in report}))
"""


def test_recompilation_report_tells_new_shapes_from_dynamic_ops(python, tmp_path):
    env = {"VIRTUAL_HPU": "1", "PT_HPU_LAZY_MODE": "1", "PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES": "1"}
    result = python(RECOMPILING_MODEL, script_dir=tmp_path, **env)
    assert result.returncode == 0, result.stderr
    reports = dict(line.split(" ", 2)[1:] for line in result.stdout.splitlines() if line.startswith("REPORT"))
    # static: modules compile at the first step and at the new input shape (step 2), never at a shape they have seen
    static = eval(reports["False"])
    assert {step for step, _, _ in static} == {0, 2} and all(new for _, _, new in static)
    # named as on Gaudi (graphs the first, dynamic model compiled are in the cache already)
    assert {"Net", "Net/1"} <= {module for _, module, _ in static} <= {"Net", "Net/0", "Net/1", "Net/1/conv"}
    # dynamic: the module with the boolean index recompiles at a shape it has already seen (step 1 or 3)
    dynamic = eval(reports["True"])
    assert any(module == "Net/1" and not new for step, module, new in dynamic if step in (1, 3))
    assert "Recompiling modules" in result.stdout and "Recompile count" in result.stdout
    # the report's two files, as Gaudi's tool writes them
    per_step = (tmp_path / "True_1.csv").read_text().splitlines()
    assert per_step[0] == "Step,Recompiling modules,New in,New out,Class,Location,Comment"
    assert any(line.startswith("1,Net/1,False,") or line.startswith("3,Net/1,False,") for line in per_step)
    per_module = (tmp_path / "True_2.csv").read_text().splitlines()
    assert per_module[0] == "Module name,Recompile count" and len(per_module) > 1


def test_data_dynamicity_counts_the_input_shapes(python):
    code = """
import torch
from torch.utils.data import DataLoader, TensorDataset
from habana_frameworks.torch.utils.experimental import data_dynamicity
loader = DataLoader(TensorDataset(torch.zeros(23, 4), torch.zeros(23)), batch_size=7)
print("COUNTS", sorted(data_dynamicity(loader).values()))
"""
    result = python(code, VIRTUAL_HPU="1")
    assert result.returncode == 0, result.stderr
    assert "COUNTS [1, 3]" in result.stdout and "a little dynamicity" in result.stdout
