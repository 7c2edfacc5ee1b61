"""Gaudi's fused optimizers (``habana_frameworks.torch.hpex.optimizers``) in Lightning: returned from
``configure_optimizers`` with an LR scheduler, trained on 2 HPUs, checkpointed and resumed."""

from pathlib import Path

import pytest

from tests_pytorch.helpers.processes import assert_same_parameters, rank_results, run_ddp, wait

SCRIPT = Path(__file__).parents[1] / "helpers" / "hpex_optimizers_run.py"


@pytest.mark.heavy
@pytest.mark.parametrize(
    ("fused", "counterpart", "state_keys"),
    [
        ("FusedAdamW", "AdamW", ["exp_avg", "exp_avg_sq", "step"]),
        # resumes as FusedAdamW does; a stress run (27 s), to keep the suite under its time
        pytest.param("FusedSGD", "SGD", ["momentum_buffer"], marks=pytest.mark.stress),
    ],
)
def test_a_resumed_two_hpu_run_ends_where_torchs_optimizer_does_uninterrupted(tmp_path, fused, counterpart, state_keys):
    checkpoint, first, resumed, reference = (tmp_path / name for name in ("fit.ckpt", "first", "resumed", "torch"))
    for folder in (first, resumed, reference):
        folder.mkdir()
    wait(
        run_ddp(first, "--optimizer", fused, "--checkpoint", str(checkpoint), script=SCRIPT),
        run_ddp(reference, "--optimizer", counterpart, "--max-epochs", "2", script=SCRIPT),
    )
    wait(run_ddp(resumed, "--optimizer", fused, "--max-epochs", "2", "--resume", str(checkpoint), script=SCRIPT))
    ranks, expected = rank_results(resumed), rank_results(reference)
    assert [r["world_size"] for r in ranks] == [2, 2] and [r["optimizer"] for r in ranks] == [fused, fused]
    assert [r["state_keys"] for r in ranks] == [state_keys] * 2
    # the optimizer's moments or momentum and the scheduler's position came back from the checkpoint
    assert [r["global_step"] for r in ranks] == [r["global_step"] for r in expected] == [8, 8]
    assert ranks[0]["lr"] == pytest.approx(expected[0]["lr"])
    for rank, reference_rank in zip(ranks, expected):
        assert_same_parameters(rank["state"], reference_rank["state"], tolerance=1e-6)
