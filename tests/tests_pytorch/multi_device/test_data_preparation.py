"""Data prepared once per node while the other ranks wait: the Trainer's ``prepare_data`` and Fabric's
``rank_zero_first``, on 2 HPUs."""

import pytest

from tests_pytorch.helpers.processes import rank_results, wait
from tests_pytorch.multi_device.test_fabric_patterns import launch as fabric_launch
from tests_pytorch.multi_device.test_trainer_patterns import assert_close, launch


@pytest.mark.heavy
def test_datamodule_prepares_data_once(tmp_path):
    wait(launch(tmp_path / "run", "datamodule"))
    ranks = rank_results(tmp_path / "run")
    assert [observed["prepared"] for observed in ranks] == [1, 0]  # local rank 0 prepares
    assert ranks[0]["test"] == ranks[1]["test"]
    assert_close(ranks[0]["weights"], ranks[1]["weights"], tolerance=0)


def test_rank_zero_first_prepares_data_once(tmp_path):
    ranks = fabric_launch(tmp_path / "run", "rank_zero_first")
    assert (tmp_path / "run" / "preparations.txt").read_text() == "rank 0\n"
    assert [observed["rows"] for observed in ranks] == [16, 16]
