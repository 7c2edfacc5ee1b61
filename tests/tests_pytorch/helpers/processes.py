"""Run ``ddp_run.py`` as a job of its own (Lightning starts its other ranks) and read what each rank saved."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

DDP_RUN = Path(__file__).with_name("ddp_run.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ddp(out: Path, *args: str, script: Path = DDP_RUN, **env: str) -> subprocess.Popen:
    """Start ``ddp_run.py --out <out> *args`` (or another script of this folder); each rank saves ``rank<N>.pt``
    there."""
    environment = {**os.environ, "MASTER_ADDR": "127.0.0.1", **env}
    environment.setdefault("MASTER_PORT", str(free_port()))
    return subprocess.Popen(
        [sys.executable, str(script), "--out", str(out), *args],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait(*processes: subprocess.Popen) -> None:
    for process in processes:
        output, _ = process.communicate(timeout=240)
        assert process.returncode == 0, output


def rank_results(out: Path) -> list:
    """What each rank of a finished run saved, by rank."""
    return [torch.load(path) for path in sorted(out.glob("rank*.pt"))]


def assert_same_parameters(first: dict, second: dict, tolerance: float = 0.0) -> None:
    assert first.keys() == second.keys()
    for name in first:
        torch.testing.assert_close(first[name], second[name], rtol=tolerance, atol=tolerance, msg=name)


def marked(output: str, marker: str) -> list[str]:
    """What follows ``marker`` on each line of ``output`` that has it.

    Each process writes its report in one write ending its line, but another process's output without a line end (a
    progress bar's, a library's log) may stand before it in a shared pipe: a report was lost so in a full run when
    only lines starting with the marker were read."""
    return [line.split(marker, 1)[1] for line in output.splitlines() if marker in line]
