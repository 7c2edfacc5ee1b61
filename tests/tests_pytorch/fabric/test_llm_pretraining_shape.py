"""An LLM pretraining script written for CUDA Fabric (LitGPT's ``pretrain.py`` shape: FSDP ``HYBRID_SHARD`` with block
auto-wrap, ``rank_zero_first``, ``torch.compile(model)`` with the default backend, ``bf16-mixed``, ``fabric.save``)
runs unchanged on 2 HPUs of an 8-card node, and its loss curve follows the CPU's.

``helpers/llm_pretraining_run.py`` leaves the accelerator to ``auto``. With FSDP averaging the ranks' gradients, the
mean of the 2 ranks' losses at each step is the loss of the 1-device run on the whole batch; the 1-HPU run is compared
with the 1-CPU run step by step (bf16 autocast on both, so bf16's tolerance).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests_pytorch.helpers import llm_pretraining_run
from tests_pytorch.helpers.processes import free_port, rank_results

SCRIPT = Path(llm_pretraining_run.__file__)
# bf16 autocast: about 3 significant digits per matmul, over a few optimizer steps
BF16 = {"rtol": 2e-2, "atol": 2e-2}


def _launch(out: Path, *args: str) -> subprocess.Popen:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PT_HPU", "LOCAL_RANK", "RANK"))}
    env.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), VIRTUAL_HPU_DEVICES="8")
    command = [sys.executable, str(SCRIPT), "--out", str(out), *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finished(run: subprocess.Popen, out: Path) -> list:
    output, _ = run.communicate(timeout=1500)
    assert run.returncode == 0, output
    return rank_results(out)


@pytest.mark.heavy
@pytest.mark.slow
def test_llm_pretraining_script_on_two_hpus_follows_the_cpu(tmp_path):
    runs = {
        "two_hpus": ("--devices", "2"),
        "one_hpu": ("--devices", "1"),
        "one_cpu": ("--devices", "1", "--accelerator", "cpu"),
    }
    started = {name: _launch(tmp_path / name, *args) for name, args in runs.items()}
    results = {name: _finished(run, tmp_path / name) for name, run in started.items()}

    assert [rank["device"] for rank in results["two_hpus"]] == ["hpu", "hpu"]
    assert results["one_hpu"][0]["device"] == "hpu" and results["one_cpu"][0]["device"] == "cpu"
    cpu = torch.tensor(results["one_cpu"][0]["losses"])
    assert len(cpu) == llm_pretraining_run.STEPS and cpu[-1] < cpu[0]
    torch.testing.assert_close(torch.tensor(results["one_hpu"][0]["losses"]), cpu, **BF16)
    two_hpus = torch.tensor([rank["losses"] for rank in results["two_hpus"]]).mean(dim=0)
    torch.testing.assert_close(two_hpus, cpu, **BF16)

    # the full checkpoint, gathered on rank 0, holds the uncompiled model's weights
    checkpoint = torch.load(tmp_path / "two_hpus" / "final" / "lit_model.pth", weights_only=True)
    assert checkpoint["model"].keys() == llm_pretraining_run.GPT().state_dict().keys()
    assert checkpoint["step"] == llm_pretraining_run.STEPS
