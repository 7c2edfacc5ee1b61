"""``RunIf``: skip a test unless the machine has what it needs."""

import importlib.util
import sys
from typing import Any

import pytest


def _virtual_gaudi_active() -> bool:
    virtual = sys.modules.get("virtual_hpu")
    return virtual is not None and virtual.is_active()


def _real_gaudi_installed() -> bool:
    return importlib.util.find_spec("habana_frameworks") is not None and not _virtual_gaudi_active()


def RunIf(
    hpu: bool = False, virtual_hpu: bool = False, tb_profiler: bool = False, **kwargs: Any
) -> pytest.MarkDecorator:
    """A ``skipif`` mark for what the test needs.

    Args:
        hpu: a real Intel Gaudi (the virtual one does not count). Tests of the integration itself run on the virtual
            Gaudi and need no mark; this is for what only hardware can show (graph compilation, HCCL, speed).
        virtual_hpu: the virtual Gaudi, for tests that read its accounting (graph cuts, host syncs), which real
            hardware does not expose.
        tb_profiler: the optional ``torch-tb-profiler`` package (requirements/profiler.txt).
    """
    reasons = []
    if hpu and not _real_gaudi_installed():
        reasons.append("a real Intel Gaudi")
    if virtual_hpu and not _virtual_gaudi_active():
        reasons.append("the virtual Gaudi's accounting")
    if tb_profiler and importlib.util.find_spec("torch_tb_profiler") is None:
        reasons.append("the optional `torch-tb-profiler` package")
    return pytest.mark.skipif(bool(reasons), reason=f"Requires {' and '.join(reasons)}", **kwargs)
