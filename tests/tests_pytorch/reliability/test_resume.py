"""Training SIGKILLed mid-run and resumed from its last checkpoint ends with the weights of an uninterrupted run, bit
for bit: weights, AdamW state, the per-step LR schedule, the loader's position mid-epoch and the random state of
dropout all come back.

Lightning restores the first three; the loader must be resumable (``state_dict``/``load_state_dict``) and Lightning
keeps no random state in checkpoints: ``run.py`` has a loader and a callback that do it, as users need to.
"""

import signal

import pytest
import torch

# the module's runs (1 and 2 devices, uninterrupted and killed) start at once and take most of a minute of both cores
pytestmark = pytest.mark.heavy

STEPS, EVERY, KILL_AT = 20, 3, 11  # checkpoints after steps 3, 6, 9, ...; killed after step 11; resumed at step 9


def _args(devices: int) -> list[str]:
    strategy = "hpu_parallel" if devices > 1 else "auto"
    return ["--devices", str(devices), "--strategy", strategy, "--steps", str(STEPS), "--every", str(EVERY)]


@pytest.fixture(scope="module")
def runs(run_module, tmp_path_factory):
    """For 1 and 2 devices: an uninterrupted run, and a run killed after step 11 then resumed; all overlapping."""
    runs = {}
    for devices in (1, 2):
        root = tmp_path_factory.mktemp(f"devices{devices}")
        runs[devices] = {
            "root": root,
            "uninterrupted": run_module("train", *_args(devices), "--dir", str(root / "full")),
            "killed": run_module("train", *_args(devices), "--dir", str(root / "part"), "--kill-at", str(KILL_AT)),
        }
    for devices, scenario in runs.items():
        killed, part = scenario["killed"], scenario["root"] / "part"
        assert killed.finish() == -signal.SIGKILL, killed.output[-3000:]
        # every rank died with it, after the checkpoint of step 9
        assert not list(part.glob("final-*")), "a rank finished although the run was killed"
        assert max(torch.load(path, weights_only=False)["global_step"] for path in part.glob("*.ckpt")) == 9
        scenario["resumed"] = run_module("train", *_args(devices), "--dir", str(part), "--resume")
    return runs


@pytest.mark.parametrize("devices", [1, 2])
def test_resume_after_sigkill_is_exact(runs, devices):
    full, part = runs[devices]["root"] / "full", runs[devices]["root"] / "part"
    uninterrupted, resumed = runs[devices]["uninterrupted"], runs[devices]["resumed"]
    assert resumed.finish() == 0, resumed.output[-3000:]
    assert "Restored all states from the checkpoint" in resumed.output
    assert uninterrupted.finish() == 0, uninterrupted.output[-3000:]
    for rank in range(devices):
        reference = torch.load(full / f"final-rank{rank}.pt")
        result = torch.load(part / f"final-rank{rank}.pt")
        assert (reference["started_at"], result["started_at"]) == (0, 9)
        assert reference["global_step"] == result["global_step"] == STEPS
        for name, weights in reference["weights"].items():
            assert torch.equal(result["weights"][name], weights), f"rank {rank}: {name} differs"
