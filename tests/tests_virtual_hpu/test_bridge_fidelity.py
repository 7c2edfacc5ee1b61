"""Behaviour of Intel's bridge that code written for a Gaudi relies on: replaying a graph before its first capture, and
importing the bridge as a script's first import."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
STARTUP_HOOK = ROOT / "src" / "virtual_hpu" / "_startup.pth"


@pytest.mark.parametrize("hpu_mode", ["lazy"])
def test_replay_before_any_capture_does_nothing(hpu_mode):
    """The bridge's replay runs the graphs captured so far: none before the first capture (a validation loop may
    replay before its first training capture)."""
    from habana_frameworks.torch.hpu.graphs import HPUGraph

    graph = HPUGraph()
    graph.replay()
    x = torch.ones(3, device="hpu")
    graph.replayV3([x])
    graph.reset()
    graph.replay()
    assert x.tolist() == [1.0, 1.0, 1.0]


@pytest.fixture
def site_dir(tmp_path):
    """A site directory holding the start-up hook as installs put it (``setup.py``), for a child to add."""
    shutil.copy(STARTUP_HOOK, tmp_path / "virtual_hpu_startup.pth")
    return tmp_path


@pytest.mark.parametrize("lazy", ["0", "1"])
def test_the_bridge_may_be_a_scripts_first_import(python, site_dir, lazy):
    """On a Gaudi the bridge is installed: ``import habana_frameworks.torch.core`` works before ``import torch``."""
    result = python(
        f"""
        import site, sys
        site.addsitedir({str(site_dir)!r})  # what the interpreter does with site-packages at start-up
        assert "torch" not in sys.modules
        import habana_frameworks.torch.core as htcore
        import torch
        x = torch.ones(2, device="hpu") * 3
        htcore.mark_step()
        print(htcore.is_lazy(), x.sum().item())
        """,
        VIRTUAL_HPU="1",
        PT_HPU_LAZY_MODE=lazy,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[-2] == f"{lazy == '1'} 6.0"


def test_the_startup_hook_does_nothing_without_virtual_hpu(python, site_dir):
    result = python(
        f"""
        import site, sys
        site.addsitedir({str(site_dir)!r})
        print(sorted(name for name in sys.modules if name.startswith(("virtual_hpu", "torch"))))
        try:
            import habana_frameworks
        except ModuleNotFoundError as error:
            print(error)
        """,
        VIRTUAL_HPU="0",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[-3:-1] == ["[]", "No module named 'habana_frameworks'"]


def test_installs_put_the_startup_hook_at_the_top_of_site_packages(tmp_path):
    """A wheel's top level is site-packages; an editable install writes there directly (``setup.py``)."""
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    assert (tmp_path / "virtual_hpu_startup.pth").read_text() == STARTUP_HOOK.read_text()
    assert not (tmp_path / "habana_frameworks").exists()  # the facade stays inside virtual_hpu
