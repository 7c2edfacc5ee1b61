"""What Fabric users do on several devices, on 2 HPUs (``helpers/fabric_patterns_run.py``, see there)."""

from pathlib import Path

import pytest
import torch

from tests_pytorch.helpers.processes import rank_results, run_ddp, wait

SCRIPT = Path(__file__).parents[1] / "helpers" / "fabric_patterns_run.py"


def launch(out: Path, scenario: str) -> list:
    out.mkdir()
    wait(run_ddp(out, "--scenario", scenario, script=SCRIPT))
    return rank_results(out)


@pytest.fixture(scope="module")
def collectives(tmp_path_factory) -> tuple:
    root = tmp_path_factory.mktemp("fabric")
    return launch(root / "run", "collectives"), root / "run"


def test_broadcast_all_gather_all_reduce(collectives):
    ranks, _ = collectives
    assert [observed["device"] for observed in ranks] == ["hpu:0", "hpu:1"]
    for observed in ranks:
        assert observed["broadcast_object"] == {"from": 0, "items": [0, 0]}
        assert torch.equal(observed["broadcast_tensor"], torch.tensor([5.0]))
        assert torch.equal(observed["all_gather"], torch.tensor([[0, 10], [1, 11]]))
        assert torch.equal(observed["all_gather_dict"]["a"], torch.tensor([0, 1]))
        assert torch.equal(observed["all_gather_dict"]["b"][0], torch.ones(2, 2))
        assert torch.equal(observed["all_reduce_dict"]["x"], torch.tensor([3.0, 3.0]))
        for name, value in observed["all_reduce"].items():
            op, dtype = name.split()
            expected = {"sum": 3, "max": 2, "min": 1, "mean": 1.5}[op]
            # the value, in the dtype it was given
            assert value.dtype == getattr(torch, dtype) and value.item() == expected, name
        assert len(observed["all_reduce"]) == 17


def test_no_backward_sync_accumulates_then_synchronises(collectives):
    ranks, _ = collectives
    assert sorted(ranks[0]["seen"] + ranks[1]["seen"]) == list(range(16))  # the distributed sampler splits the rows
    for observed in ranks:
        # gradients stay each rank's own inside no_backward_sync, and are averaged at the step's backward
        assert observed["synchronised"] == [(False, False), (True, True)] * 2
        torch.testing.assert_close(observed["weights"], ranks[0]["weights"], rtol=0, atol=0)
        torch.testing.assert_close(observed["weights"], observed["reference"], rtol=1e-6, atol=1e-6)


def test_save_on_rank_zero_and_load_on_every_rank(collectives):
    ranks, directory = collectives
    assert sorted(path.name for path in directory.iterdir()) == ["checkpoint.ckpt", "rank0.pt", "rank1.pt"]
    for observed in ranks:
        loaded = observed["loaded"]
        assert loaded["step"] == 8
        torch.testing.assert_close(loaded["weights"], observed["weights"], rtol=0, atol=0)
        assert loaded["optimizer"].keys() == {0, 1, 2, 3}
        torch.testing.assert_close(loaded["optimizer"], loaded["saved_optimizer"], rtol=0, atol=0)
