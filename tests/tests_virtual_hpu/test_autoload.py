"""``import torch`` activates the virtual Gaudi the way the real bridge loads itself: eager mode on, lazy mode off."""

from typing import Optional

import pytest
import torch

import virtual_hpu
from virtual_hpu import torch_support


def _builds_accelerator() -> Optional[str]:
    """torch's accelerator without the virtual Gaudi: the one it was built for, if any (before torch 2.7, only where a
    device of it is available)."""
    other = virtual_hpu.other_accelerator()
    if other is not None and torch_support.installed() < torch_support.ACCELERATOR_IS_THE_BUILDS:
        return other if getattr(torch, other).is_available() else None
    return other


NONE = str(_builds_accelerator())
# and with it: hpu, but on PyPI's builds before torch 2.9, where the HPU device type sits beside that one
ACTIVE = "hpu" if virtual_hpu.is_torch_accelerator() else NONE
# what torch says its accelerator is (before 2.7 it raises where there is none)
ACCELERATOR = """
try:
    accelerator = torch.accelerator.current_accelerator()
except RuntimeError:
    accelerator = None
"""
# `transformers` asks torch for its accelerator while it is imported, before anything of Gaudi's is
QUERY = f"""
import sys
import torch
{ACCELERATOR}
print(accelerator, 'habana_frameworks' in sys.modules)
"""


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"VIRTUAL_HPU": "1"}, f"{ACTIVE} True"),
        ({"VIRTUAL_HPU": "1", "PT_HPU_LAZY_MODE": "1"}, f"{NONE} False"),
        ({"VIRTUAL_HPU": "1", "PT_HPU_LAZY_MODE": "1", "PT_HPU_AUTOLOAD": "1"}, f"{ACTIVE} True"),
        ({"VIRTUAL_HPU": "1", "PT_HPU_AUTOLOAD": "0"}, f"{NONE} False"),
        ({"VIRTUAL_HPU": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, f"{NONE} False"),
        ({}, f"{NONE} False"),
        ({"VIRTUAL_HPU": "0"}, f"{NONE} False"),
    ],
)
def test_import_torch_loads_the_virtual_gaudi_like_the_bridge(python, env, expected):
    result = python(QUERY, **env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[-2] == expected


def test_bad_autoload_flag_names_the_values(python):
    result = python(QUERY, VIRTUAL_HPU="1", PT_HPU_AUTOLOAD="yes")
    assert result.returncode != 0
    assert "PT_HPU_AUTOLOAD must be 1" in result.stderr


def test_lightning_imported_later_still_activates_in_lazy_mode(python):
    result = python(
        "import torch, pytorch_lightning; print(torch.hpu.is_available())", VIRTUAL_HPU="1", PT_HPU_LAZY_MODE="1"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[-2] == "True"


def test_a_lazy_mode_script_loads_the_bridge_itself(python):
    """The first lines of a lazy-mode script: autoload is off; ``import habana_frameworks.torch.core`` loads it."""
    code = (
        f"import torch\n{ACCELERATOR}"
        "print(accelerator)\n"
        "import habana_frameworks.torch.core as htcore\n"
        "x = torch.ones(2, device='hpu') * 3\n"
        "htcore.mark_step()\n"
        "print(htcore.is_lazy(), x.sum().item())"
    )
    result = python(code, VIRTUAL_HPU="1", PT_HPU_LAZY_MODE="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[-3:-1] == [NONE, "True 6.0"]
    # without the virtual Gaudi asked for, there is no bridge to import
    result = python("import torch, habana_frameworks", PT_HPU_LAZY_MODE="1")
    assert result.returncode != 0 and "No module named 'habana_frameworks'" in result.stderr
