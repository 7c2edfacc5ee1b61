"""Evaluation before training on one Trainer, in one process on 2 HPUs ([X] 1)."""

import pytest

from tests_pytorch.helpers.processes import rank_results, wait
from tests_pytorch.multi_device.test_trainer_patterns import assert_close, launch


@pytest.mark.parametrize("scenario", ["validate_fit", "test_fit_predict"])
def test_evaluation_before_fit_on_one_trainer(tmp_path, scenario):
    wait(launch(tmp_path / "run", scenario))
    ranks = rank_results(tmp_path / "run")
    assert [observed["global_step"] for observed in ranks] == [1, 1]
    evaluated = "validate" if scenario == "validate_fit" else "test"
    # what the Regressor logs with sync_dist (its rank_metric differs per rank on purpose)
    synced = [
        {name: value for name, value in observed[evaluated][0].items() if name != "rank_metric"} for observed in ranks
    ]
    assert synced[0] == synced[1]
    assert_close(ranks[0]["weights"], ranks[1]["weights"], tolerance=0)
    if scenario == "test_fit_predict":
        assert [len(observed["predictions"]) for observed in ranks] == [1, 1]
