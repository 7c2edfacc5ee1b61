"""What Trainer users do on several devices, on 2 HPUs against the same program on upstream's CPU DDP.

One launched run (``helpers/multi_device_run.py --scenario train``, see there) covers most patterns; the tests read
what each rank observed.
"""

from pathlib import Path

import pytest
import torch

from tests_pytorch.helpers.processes import rank_results, run_ddp, wait

SCRIPT = Path(__file__).parents[1] / "helpers" / "multi_device_run.py"
ALL_ROWS = list(range(16))


def launch(out: Path, scenario: str, accelerator: str = "hpu"):
    out.mkdir()
    return run_ddp(out, "--scenario", scenario, "--accelerator", accelerator, script=SCRIPT)


def assert_close(hpu, cpu, tolerance: float = 1e-6) -> None:
    torch.testing.assert_close(hpu, cpu, rtol=tolerance, atol=tolerance)


@pytest.fixture(scope="module")
def train(tmp_path_factory) -> tuple:
    """Each rank's observations on 2 HPUs and on 2 CPU processes, with the directory of the HPU run."""
    root = tmp_path_factory.mktemp("train")
    wait(launch(root / "hpu", "train"), launch(root / "cpu", "train", "cpu"))
    hpu, cpu = rank_results(root / "hpu"), rank_results(root / "cpu")
    assert len(hpu) == len(cpu) == 2
    return hpu, cpu, root / "hpu"


def test_collectives_in_a_hook(train):
    hpu, cpu, _ = train
    for rank, (observed, reference) in enumerate(zip(hpu, cpu)):
        collectives = observed["collectives"]
        assert collectives.pop("device") == f"hpu:{rank}"
        assert reference["collectives"].pop("device") == "cpu"
        assert_close(collectives, reference["collectives"], tolerance=0)
        assert torch.equal(collectives["all_gather"], torch.tensor([[0, 10], [1, 11]]))
        assert collectives["broadcast_object"] == {"from": 0, "items": [0, 0, 0]}
        assert collectives["all_gather_object"] == [{"rank": 0}, {"rank": 1}]
        assert collectives["sum_long"].dtype == torch.int64 and collectives["sum_long"] == 3
        assert collectives["max_half"].dtype == torch.float16 and collectives["max_half"] == 2
        assert (collectives["any"], collectives["all"]) == (True, False)
        # rank r's gathered value enters every rank's loss with weight r + 1
        assert collectives["all_gather_sync_grads"].tolist() == [2.0 * (rank + 1)]


def test_sync_dist_logging(train):
    hpu, cpu, _ = train
    synced = ("train_loss", "train_loss_epoch", "val_loss", "rank_sum", "rank_max", "lr-SGD")
    for observed, reference in zip(hpu, cpu):
        assert observed["fit_metrics"].keys() == reference["fit_metrics"].keys()
        for name in synced:
            assert observed["fit_metrics"][name] == pytest.approx(reference["fit_metrics"][name], abs=1e-6), name
            assert observed["fit_metrics"][name] == hpu[0]["fit_metrics"][name], name
        assert (observed["fit_metrics"]["rank_sum"], observed["fit_metrics"]["rank_max"]) == (3.0, 1.0)
    # logged without sync_dist, it stays each rank's own
    assert [observed["fit_metrics"]["rank_metric"] for observed in hpu] == [1.0, 0.5]


def test_early_stopping_on_a_metric_that_differs_per_rank_stops_every_rank_at_once(train):
    hpu, cpu, _ = train
    # rank 0 asks to stop after epoch 1, rank 1 never does: both stop there, and neither waits for the other
    assert [(r["stopped_epoch"], r["epoch"], r["global_step"]) for r in hpu] == [(1, 2, 4)] * 2
    assert [(r["stopped_epoch"], r["epoch"], r["global_step"]) for r in cpu] == [(1, 2, 4)] * 2


def test_gradient_accumulation_over_the_distributed_sampler(train):
    hpu, cpu, _ = train
    for epoch in range(2):
        rows = [observed["seen"]["train"][epoch * 8 : (epoch + 1) * 8] for observed in hpu]
        assert sorted(rows[0] + rows[1]) == ALL_ROWS, f"epoch {epoch}: the ranks shared or missed rows"
    assert [observed["seen"] for observed in hpu] == [reference["seen"] for reference in cpu]
    assert_close(hpu[0]["weights"], hpu[1]["weights"], tolerance=0)
    assert_close(hpu[0]["weights"], cpu[0]["weights"])


def test_checkpoints_written_by_rank_zero_and_loaded_on_every_rank(train):
    hpu, cpu, directory = train
    assert sorted(path.name for path in (directory / "checkpoints").iterdir()) == [
        "epoch=0.ckpt",
        "epoch=1.ckpt",
        "last.ckpt",
    ]
    for observed, reference in zip(hpu, cpu):
        for key in ("checkpoints", "best_model_path"):
            assert observed[key] == reference[key]
        assert observed["best_model_score"] == pytest.approx(reference["best_model_score"], abs=1e-6)
        # the Trainer saved on rank 0 and waited: every rank loads what was trained
        assert_close(observed["loaded_weights"], observed["weights"], tolerance=0)
    # saved with host tensors: it loads without a Gaudi
    saved = torch.load(directory / "saved.ckpt", weights_only=True)["state_dict"]
    assert {tensor.device for tensor in saved.values()} == {torch.device("cpu")}
    assert_close(saved, hpu[0]["weights"], tolerance=0)


def test_second_fit_resumes_from_the_last_checkpoint(train):
    hpu, cpu, _ = train
    assert [observed["resumed"]["global_step"] for observed in hpu] == [6, 6]
    assert_close(hpu[0]["resumed"]["weights"], hpu[1]["resumed"]["weights"], tolerance=0)
    assert_close(hpu[0]["resumed"]["weights"], cpu[0]["resumed"]["weights"])


def test_rank_zero_only_and_loggers_write_once(train):
    _, _, directory = train
    # a line from each fit of the Regressor (the first and the resumed one), none from rank 1
    assert (directory / "rank_zero_only.txt").read_text() == "written\n" * 2
    assert [path.name for path in (directory / "logs").iterdir()] == ["version_0"]
    lines = (directory / "logs" / "version_0" / "metrics.csv").read_text().splitlines()
    columns = lines[0].split(",")
    learning_rates = [row.split(",")[columns.index("lr-SGD")] for row in lines[1:]]
    assert [float(value) for value in learning_rates if value] == [0.05, 0.025]


def test_validate_test_and_predict_after_fit(train):
    hpu, cpu, directory = train
    for observed, reference in zip(hpu, cpu):
        for stage in ("validate", "test"):
            assert observed[stage][0].keys() == reference[stage][0].keys()
            for name, value in observed[stage][0].items():
                assert value == pytest.approx(reference[stage][0][name], abs=1e-6), (stage, name)
        assert observed["validate"][0]["val_loss"] == hpu[0]["validate"][0]["val_loss"]
        assert observed["test"][0] == hpu[0]["test"][0]
        # each rank returns the predictions of its own rows
        assert_close(observed["predictions"], reference["predictions"])
    indices = [torch.cat([index for index, _ in observed["predictions"]]).tolist() for observed in hpu]
    assert sorted(indices[0] + indices[1]) == ALL_ROWS
    for rank, observed in enumerate(hpu):
        written = torch.load(directory / "written" / f"rank{rank}.pt", weights_only=True)
        assert_close(written["predictions"], observed["predictions"], tolerance=0)
        (batches,) = written["batch_indices"]  # one dataloader
        assert [index for batch in batches for index in batch] == indices[rank]


def test_manual_optimization_with_two_optimizers(train):
    hpu, cpu, _ = train
    for observed, reference in zip(hpu, cpu):
        manual = observed["manual"]
        # without the distributed sampler, each rank reads every row
        assert manual["seen"] == ALL_ROWS * 2
        assert manual["global_step"] == 8
        assert manual["metrics"] == pytest.approx(reference["manual"]["metrics"], abs=1e-6)
        assert_close(manual["weights"], reference["manual"]["weights"])
    assert_close(hpu[0]["manual"]["weights"], hpu[1]["manual"]["weights"], tolerance=0)
