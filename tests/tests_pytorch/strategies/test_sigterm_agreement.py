"""The upstream hooks that ``strategies/_sigterm.py`` overrides still exist and are still used, and our ``Trainer``
uses its loop and signal connector; two ranks agree on SIGTERM one call late, identically, without waiting for each
other. (Behaviour in a fit: ``reliability/test_sigterm.py``, ``models/test_hpu.py``.)"""

import inspect

import pytest
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop as _UpstreamTrainingEpochLoop

import pytorch_lightning as pl
from pytorch_lightning.strategies._sigterm import OVERRIDDEN_UPSTREAM_HOOKS, _SignalConnector, _TrainingEpochLoop
from tests_virtual_hpu.ranks import run_ranks


@pytest.mark.parametrize(("upstream", "name"), OVERRIDDEN_UPSTREAM_HOOKS)
def test_upstream_still_has_the_overridden_hooks(upstream, name):
    assert callable(vars(upstream).get(name)), (
        f"upstream's {upstream.__name__}.{name} is gone: pytorch_lightning/strategies/_sigterm.py overrides it to keep"
        " host syncs out of every training step; adapt it to upstream's new code"
    )


def test_upstream_training_step_still_agrees_on_sigterm_through_the_hook():
    assert "self._broadcast_sigterm_tensor()" in inspect.getsource(_UpstreamTrainingEpochLoop.advance)


@pytest.mark.parametrize("kwargs", [{}, {"max_steps": 7, "min_steps": 2}, {"fast_dev_run": 3}])
def test_trainer_uses_the_host_side_loop_and_connector(kwargs):
    trainer = pl.Trainer(accelerator="hpu", devices=1, logger=False, **kwargs)
    assert type(trainer._signal_connector) is _SignalConnector
    loop = trainer.fit_loop.epoch_loop
    assert type(loop) is _TrainingEpochLoop
    upstream = pl.Trainer.__mro__[1](accelerator="cpu", devices=1, logger=False, **kwargs).fit_loop.epoch_loop
    assert (loop.min_steps, loop.max_steps) == (upstream.min_steps, upstream.max_steps)


LATE = 3  # seconds rank 1 takes before its third call

# each rank calls ``any_rank`` as the training loop does, once per step, until it returns True; rank 1 notes a SIGTERM
# at its third call only, and comes to that call late
_RANK = """
import json, os, sys, time
from datetime import timedelta

import torch
import torch.distributed as dist
import habana_frameworks.torch.distributed.hccl  # registers the hccl backend (the virtual Gaudi's, after torch)

from pytorch_lightning.strategies._sigterm import SigtermAgreement

rank = int(os.environ["RANK"])
device = torch.device("hpu", rank)
torch.hpu.set_device(device)
dist.init_process_group("hccl", device_id=device, timeout=timedelta(seconds=60))  # as Lightning does
late = float(sys.argv[1])

agreement = SigtermAgreement()
answers, seconds = [], []
while not (answers and answers[-1]) and len(answers) < 6:
    if rank == 1 and len(answers) == 2:
        time.sleep(late)
    started = time.monotonic()
    answers.append(agreement.any_rank(rank == 1 and len(answers) == 2))
    seconds.append(time.monotonic() - started)
agreement.close()

# closed with an exchange in flight
again = SigtermAgreement()
again.any_rank(rank == 0)
again.close()
dist.destroy_process_group()
print(json.dumps({"answers": answers, "seconds": seconds}), flush=True)
"""


def test_ranks_agree_one_call_late_on_one_ranks_sigterm_without_waiting_for_each_other(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    ranks = run_ranks(script, str(LATE), timeout=150)
    # the same answer on every rank at every call, one call after rank 1 noted it
    for rank in ranks:
        assert rank["answers"] == [False, False, False, True], ranks
    # rank 0 got its answer at the third call while rank 1 was still on its way to it: the exchange it collected was
    # the one started at the second call
    assert ranks[0]["seconds"][2] < LATE / 2, ranks
