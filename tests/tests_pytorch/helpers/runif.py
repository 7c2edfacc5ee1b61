"""``RunIf``: skip a test unless the machine has what it needs."""

import importlib.util
from typing import Any

import pytest


def _real_gaudi_installed() -> bool:
    import sys

    spec = importlib.util.find_spec("habana_frameworks")
    virtual = sys.modules.get("virtual_hpu")
    return spec is not None and not (virtual is not None and virtual.is_active())


def RunIf(hpu: bool = False, deepspeed: bool = False, **kwargs: Any) -> pytest.MarkDecorator:
    """A ``skipif`` mark for what the test needs.

    Args:
        hpu: a real Intel Gaudi (the virtual one does not count). Tests of the integration itself run on the virtual
            Gaudi and need no mark; this is for what only hardware can show (graph compilation, HCCL, speed).
        deepspeed: the optional ``deepspeed`` package.
    """
    reasons = []
    if hpu and not _real_gaudi_installed():
        reasons.append("a real Intel Gaudi")
    if deepspeed and importlib.util.find_spec("deepspeed") is None:
        reasons.append("the optional `deepspeed` package")
    return pytest.mark.skipif(bool(reasons), reason=f"Requires {' and '.join(reasons)}", **kwargs)
