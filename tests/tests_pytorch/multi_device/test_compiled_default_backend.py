"""A module compiled as CUDA code compiles it, trained on 2 HPUs."""

import pytest

from tests_pytorch.helpers.processes import rank_results, wait
from tests_pytorch.multi_device.test_trainer_patterns import assert_close, launch


@pytest.mark.heavy
def test_compiled_module_with_the_default_backend(tmp_path):
    """``Trainer.fit(torch.compile(model))``, as CUDA code writes it."""
    wait(launch(tmp_path / "run", "compiled"))
    ranks = rank_results(tmp_path / "run")
    assert [observed["global_step"] for observed in ranks] == [4, 4]
    assert ranks[0]["validate"][0]["val_loss"] == ranks[1]["validate"][0]["val_loss"]
    assert_close(ranks[0]["weights"], ranks[1]["weights"], tolerance=0)
