"""The virtual Gaudi works on every build of torch: the CPU build (as Gaudi's torch is) and one built for another
accelerator (PyPI's default CUDA build on Linux, no GPU needed).

torch has one accelerator, and its autograd synchronizes the streams of that device type only. On the CPU build hpu is
torch's HPU device type; on a build with another accelerator it is torch's PrivateUse1 backend, named "hpu", and so
torch's accelerator, from torch 2.9 on (before, the string "hpu" always named the HPU device type, which it stays,
beside the build's accelerator).
Each test runs in a fresh process, as activation changes torch for the process. Outside ``tests_virtual_hpu``, whose
conftest activates the virtual Gaudi, so that the CI jobs on other torch releases run this first.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import virtual_hpu
from virtual_hpu import torch_support

SRC = str(Path(__file__).resolve().parents[2] / "src")


def python(code: str, **env: str) -> subprocess.CompletedProcess:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_HPU", "PT_HPU"))}
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(command, env={**child_env, **env}, capture_output=True, text=True, timeout=900)


def test_the_virtual_gaudi_trains_on_this_build():
    result = python(
        """
        import torch
        import virtual_hpu

        virtual_hpu.activate()
        print(virtual_hpu.other_accelerator(), virtual_hpu.is_privateuse1(), torch._C._get_privateuse1_backend_name())
        print(torch.accelerator.current_accelerator().type)
        model = torch.nn.Linear(4, 2).to("hpu")
        x = torch.randn(8, 4, device="hpu")
        with torch.autocast("hpu"):  # Gaudi's default autocast dtype
            out = model(x)
        print(out.dtype, out.device)
        out.float().pow(2).mean().backward()
        print(model.weight.grad.device, bool(model.weight.grad.abs().sum() > 0))
        """,
        PT_HPU_AUTOLOAD="0",
    )
    assert result.returncode == 0, result.stderr
    build, accelerator, autocast, grad = result.stdout.splitlines()[-4:]
    other, privateuse1, backend = build.split()
    built_for = next(
        (n for n, b in [("cuda", torch._C._has_cuda), ("xpu", torch._C._has_xpu), ("mps", torch._C._has_mps)] if b),
        None,
    )
    assert other == str(built_for)
    # from 2.9 on, where "hpu" can name a renamed PrivateUse1 backend
    expected_privateuse1 = built_for is not None and tuple(map(int, torch.__version__.split(".")[:2])) >= (2, 9)
    assert privateuse1 == str(expected_privateuse1)
    assert backend == ("hpu" if expected_privateuse1 else "privateuseone")
    # torch's accelerator: hpu, but where the HPU device type sits beside the one torch was built for (before 2.9),
    # that one (before 2.7, only where a device of it is present)
    if built_for is not None and not expected_privateuse1:
        named_unavailable = torch_support.installed() >= torch_support.ACCELERATOR_IS_THE_BUILDS
        assert accelerator == (built_for if named_unavailable or getattr(torch, built_for).is_available() else "hpu")
    else:
        assert accelerator == "hpu"
    assert virtual_hpu.is_torch_accelerator() is (accelerator == "hpu")
    assert autocast == "torch.bfloat16 hpu:0"
    assert grad == "hpu:0 True"


def test_virtual_hpu_1_trains_from_import_torch():
    result = python(
        """
        import torch

        x = torch.ones(3, device="hpu", requires_grad=True)
        (x * 2).sum().backward()
        print(x.grad.tolist(), x.grad.device.type)
        """,
        VIRTUAL_HPU="1",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[2.0, 2.0, 2.0] hpu"


def test_a_privateuse1_backend_named_otherwise_is_refused_at_activation():
    """Another device extension loaded first holds torch's PrivateUse1 backend, and would be its accelerator."""
    result = python(
        """
        import torch
        torch.utils.rename_privateuse1_backend("other_accelerator")
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
    state, message = result.stdout.rstrip("\n").split("\n")[-2:]
    assert state == "False False"  # refused before it changed anything
    assert "torch's PrivateUse1 backend is already 'other_accelerator'" in message
    assert "Do not load that extension in a process with the virtual Gaudi" in message


@pytest.mark.parametrize(
    ("version", "advice"),
    [
        ("2.5.1a0+git1234", "use Intel's Gaudi software 1.21 or newer"),
        ("2.16.0", "Releases after 2.15 are not tested with it yet"),
    ],
)
def test_a_torch_outside_the_supported_range_is_refused_before_anything_is_built(version, advice):
    """Outside the range the sources do not compile: the message names the range and what to install instead."""
    result = python(
        f"""
        import torch
        torch.__version__ = {version!r}
        import virtual_hpu
        try:
            virtual_hpu.activate()
        except RuntimeError as error:
            print(virtual_hpu.is_active(), hasattr(torch, "hpu"))
            print(error)
        """,
        PT_HPU_AUTOLOAD="0",
        TORCH_EXTENSIONS_DIR="/nonexistent/never-built",
    )
    assert result.returncode == 0, result.stderr
    state, message = result.stdout.rstrip("\n").split("\n")[-2:]
    assert state == "False False"
    assert f"The virtual Gaudi needs torch 2.6 to 2.15, and this Python has torch {version}." in message
    assert advice in message
    assert "pip install 'torch>=2.6,<2.16'" in message


def test_import_pytorch_lightning_with_virtual_hpu_on_an_unsupported_torch_fails_with_the_range():
    """``VIRTUAL_HPU=1`` asks for HPU: importing the package names the range, not a compiler log."""
    result = python(
        """
        import torch
        torch.__version__ = "2.5.1"
        import pytorch_lightning
        """,
        VIRTUAL_HPU="1",
        PT_HPU_AUTOLOAD="0",
        TORCH_EXTENSIONS_DIR="/nonexistent/never-built",
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: The virtual Gaudi needs torch 2.6 to 2.15, and this Python has torch 2.5.1.")


def test_custom_ops_and_collectives_run_under_autograd_on_this_build():
    """The fp8 cast and the c10d collectives, which have no autograd kernel of their own, run on hpu tensors while
    autograd is on: on PyPI's torch 2.9 the virtual Gaudi registers the PrivateUse1 autograd fallback that torch 2.10
    registers itself (without it: "Could not run ... from the 'Autogradhpu' backend")."""
    result = python(
        """
        import os, torch, torch.distributed as dist
        import virtual_hpu

        virtual_hpu.activate()
        import habana_frameworks.torch.distributed.hccl  # noqa: F401

        x = torch.randn(4, 4, device="hpu", requires_grad=True)
        cast, _ = torch.ops.hpu.cast_to_fp8_v2(x, None, False, False, torch.float8_e4m3fn)
        print("cast:", cast.dtype, cast.device)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["TEST_PORT"])
        dist.init_process_group("hccl", rank=0, world_size=1)
        total = torch.ones(3, device="hpu")
        dist.all_reduce(total)
        dist.barrier()
        print("reduced:", total.tolist())
        dist.destroy_process_group()
        """,
        TEST_PORT=str(_free_port()),
    )
    assert result.returncode == 0, result.stderr
    # gloo has its own lines on stdout from torch 2.9
    said = [line for line in result.stdout.splitlines() if line.startswith(("cast:", "reduced:"))]
    assert said == ["cast: torch.float8_e4m3fn hpu:0", "reduced: [1.0, 1.0, 1.0]"], result.stdout


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
