"""The virtual Gaudi needs a build of torch without an accelerator of its own, as Gaudi's torch is.

torch has one accelerator, and its autograd synchronizes the streams of that device type only: on a build for CUDA
(PyPI's default on Linux), every backward pass over hpu tensors failed ("Cannot have both HPU and cuda"), and so did
``torch.accelerator`` and DataLoader's ``pin_memory``. Activation refuses such a build at once, saying what to install.
On the CPU build a PrivateUse1 backend registered first stands for the other accelerator; on a CUDA build, CUDA is it.
Outside ``tests_virtual_hpu``, whose tests need the virtual Gaudi active, so that they run on a CUDA build too
(``.ci/cuda_torch``).
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")


def python(code: str, **env: str) -> subprocess.CompletedProcess:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_HPU", "PT_HPU"))}
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(command, env={**child_env, **env}, capture_output=True, text=True, timeout=300)


ANOTHER_ACCELERATOR = """
import torch
if not torch.backends.cuda.is_built():  # the CPU build: another backend takes the accelerator
    torch.utils.rename_privateuse1_backend("other_accelerator")
print(torch._C._get_privateuse1_backend_name() if not torch.backends.cuda.is_built() else "cuda")
"""


def test_a_torch_build_with_another_accelerator_is_refused_at_activation():
    result = python(
        ANOTHER_ACCELERATOR
        + """
import virtual_hpu
try:
    virtual_hpu.activate()
except RuntimeError as error:
    print(virtual_hpu.is_active(), hasattr(torch, "hpu"))
    print(error)
""",
        PT_HPU_AUTOLOAD="0",
    )
    assert result.returncode == 0, result.stderr
    accelerator, state, message = result.stdout.rstrip("\n").split("\n")[-3:]
    assert state == "False False"  # refused before it changed anything
    assert f"is built for {accelerator!r}" in message
    assert "Install the CPU build of the same torch version" in message


def test_virtual_hpu_1_on_such_a_build_names_the_fix():
    """With ``VIRTUAL_HPU=1`` the first activation (``import torch``'s autoload, or the bridge's import) says what to
    do, instead of a failure at the first backward pass."""
    result = python(ANOTHER_ACCELERATOR + "import habana_frameworks.torch.core", VIRTUAL_HPU="1", PT_HPU_AUTOLOAD="0")
    assert result.returncode != 0
    assert "The virtual Gaudi needs a build of torch without another accelerator" in result.stderr
