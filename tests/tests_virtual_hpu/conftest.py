"""The virtual Gaudi is activated once for the test session; tests needing a fresh process use ``run_python``."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _activate() -> None:
    import virtual_hpu

    if virtual_hpu.real_installation() is not None:
        return  # a Gaudi: this whole tier is skipped (tests/conftest.py)
    # Once active, the facade makes `habana_frameworks` importable: tell subprocesses of other suites in the same
    # session, which decide from that import whether a real Gaudi is installed, that this session is virtual.
    os.environ.setdefault("VIRTUAL_HPU", "1")
    virtual_hpu.activate(devices=8, generation="GAUDI2")


_activate()


# where this process's ranks meet, written by the bridge when it loaded (or by a launcher): not the child's
_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "ID", "HLS_MODULE_ID")


def run_python(code: str, script_dir: Optional[Path] = None, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with ``src`` importable and ``env`` added to the environment (without the
    virtual Gaudi's and the bridge's settings, nor the ranks, of this process).

    With ``script_dir`` the code runs from a file there, as code that spawns processes needs.
    """
    child_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VIRTUAL_HPU", "PT_HPU", "LOWER_LIST", "FP32", "OMPI_")) and k not in _RENDEZVOUS
    }
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))
    child_env.update(env)
    code = textwrap.dedent(code)
    command = [sys.executable, "-c", code]
    if script_dir is not None:
        script = script_dir / "script.py"
        script.write_text(code)
        command = [sys.executable, str(script)]
    return subprocess.run(command, env=child_env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def python():
    """``python(code, **env)`` -> completed process of a fresh interpreter (see ``run_python``)."""
    return run_python
