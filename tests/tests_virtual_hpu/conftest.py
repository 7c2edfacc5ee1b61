"""The virtual Gaudi is activated once for the test session; tests needing a fresh process use ``run_python``."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _activate() -> None:
    import virtual_hpu

    virtual_hpu.activate(devices=8, generation="GAUDI2")


_activate()


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with ``src`` importable and ``env`` added to the environment."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_HPU", "PT_HPU", "LOWER_LIST", "FP32"))}
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))
    child_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=child_env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def python():
    """``python(code, **env)`` -> completed process of a fresh interpreter (see ``run_python``)."""
    return run_python
