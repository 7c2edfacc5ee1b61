"""Run a script as the ranks of a job on the virtual Gaudi, as ``torchrun`` would start them, and collect their results.

Each rank is a fresh interpreter with ``VIRTUAL_HPU=1``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` set, and, as ``torchrun`` does, ``OMP_NUM_THREADS=1`` unless it is set already: the virtual devices
compute on the host, and ranks that each spin up a thread per core on a small machine slow training twenty-fold. The
script prints its results as JSON on its last line of output.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script: Path, *args: str, world_size: int = 2, timeout: float = 120) -> list:
    """Run ``script`` as ``world_size`` ranks; return what each printed last, parsed as JSON, in rank order."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_HPU", "PT_HPU", "OMPI_"))}
    env.update(
        VIRTUAL_HPU="1",
        PYTHONPATH=os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")])),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(world_size),
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
    )
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), *args],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world_size)
    ]
    outputs = []
    try:
        for rank, process in enumerate(ranks):
            stdout, stderr = process.communicate(timeout=timeout)
            assert process.returncode == 0, f"rank {rank} failed:\n{stderr}"
            outputs.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
    return outputs
