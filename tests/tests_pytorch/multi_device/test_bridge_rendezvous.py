"""Runs whose processes Lightning starts, on a Gaudi whose bridge wrote ``MASTER_ADDR=localhost`` and
``MASTER_PORT=12345`` when ``import torch`` loaded it (Gaudi software 1.21 on): each run meets on a free port of its
own, so two runs on one node do not both take port 12345."""

import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
from lightning.fabric.plugins.environments import LightningEnvironment

import pytorch_lightning as pl
from lightning_fabric.plugins.environments import HPULightningEnvironment
from tests_pytorch.helpers import fabric_run
from tests_pytorch.helpers.processes import rank_results

_RANKS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


@pytest.fixture
def bridge_rendezvous(monkeypatch):
    """The process as the bridge leaves a script that no launcher started."""
    for name in _RANKS:
        monkeypatch.delenv(name, raising=False)
    for name in [name for name in os.environ if name.startswith(("OMPI_COMM_WORLD", "SLURM_", "LSB_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", "12345")


@pytest.mark.parametrize("build", ["trainer", "fabric"])
def test_lightning_started_ranks_meet_on_a_free_port_not_the_bridges(bridge_rendezvous, build):
    if build == "trainer":
        environment = pl.Trainer(
            accelerator="hpu", devices=2, strategy="ddp", logger=False
        ).strategy.cluster_environment
    else:
        environment = L.Fabric(accelerator="hpu", devices=2, strategy="ddp").strategy.cluster_environment
    assert type(environment) is HPULightningEnvironment
    assert not environment.creates_processes_externally
    port = environment.main_port
    assert port != 12345 and environment.main_port == port  # chosen once, for every rank it starts


def test_the_bridges_port_beside_an_address_the_user_exported_is_set_aside_too(bridge_rendezvous, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    environment = pl.Trainer(accelerator="hpu", devices=2, strategy="ddp", logger=False).strategy.cluster_environment
    assert type(environment) is HPULightningEnvironment and environment.main_port != 12345


def test_nodes_that_lightning_starts_processes_on_keep_the_bridges_port(bridge_rendezvous, monkeypatch):
    """Every node's bridge wrote the same port: a free one picked on each node would not meet."""
    monkeypatch.setenv("NODE_RANK", "1")
    trainer = pl.Trainer(accelerator="hpu", devices=2, num_nodes=2, strategy="ddp", logger=False)
    environment = trainer.strategy.cluster_environment
    assert type(environment) is LightningEnvironment and environment.main_port == 12345


def test_a_port_the_user_set_or_a_given_environment_is_kept(bridge_rendezvous, monkeypatch):
    given = LightningEnvironment()
    trainer = pl.Trainer(accelerator="hpu", devices=2, strategy="ddp", plugins=[given], logger=False)
    assert trainer.strategy.cluster_environment is given
    monkeypatch.setenv("MASTER_PORT", "23456")
    environment = pl.Trainer(accelerator="hpu", devices=2, strategy="ddp", logger=False).strategy.cluster_environment
    assert type(environment) is LightningEnvironment and environment.main_port == 23456


@pytest.mark.heavy
def test_two_runs_on_one_node_train_side_by_side(tmp_path):
    """Two 2-rank Fabric runs started at once from plain processes, which the (virtual) bridge gives its rendezvous."""
    environment = {
        key: value for key, value in os.environ.items() if key not in ("MASTER_ADDR", "MASTER_PORT", *_RANKS)
    }
    environment["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, str(Path(fabric_run.__file__)), "--devices", "2", "--strategy", "ddp", "--out"]
    runs = [
        subprocess.Popen(
            [*command, str(tmp_path / str(run))],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for run in (0, 1)
    ]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], "\n".join(output[-3000:] for output in outputs)
    for run in (0, 1):
        assert [rank["gathered_rank"] for rank in rank_results(tmp_path / str(run))][0] == [[0], [1]]
