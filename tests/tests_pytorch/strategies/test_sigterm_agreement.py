"""The upstream hooks that ``strategies/_sigterm.py`` overrides still exist and are still used, and our ``Trainer``
uses its loop and signal connector; two ranks exchange their SIGTERM flags at the same calls, every few calls when calls
are fast and at every call when they are slow, and agree on it at the same call without waiting for each other.
(Behaviour in a fit: ``reliability/test_sigterm.py``, ``models/test_hpu.py``.)"""

import inspect
import json

import pytest
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop as _UpstreamTrainingEpochLoop

import pytorch_lightning as pl
from pytorch_lightning.strategies._sigterm import (
    _MAX_INTERVAL,
    _PERIOD,
    OVERRIDDEN_UPSTREAM_HOOKS,
    _proposed_interval,
    _SignalConnector,
    _TrainingEpochLoop,
)
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


LATE = 3  # seconds rank 1 takes before a call, in the scenarios it comes late to one
FAST = _PERIOD / 9.5, _PERIOD / 4.5  # seconds per call on ranks 0 and 1: they propose intervals of 10 and 5 calls
SLOW = _PERIOD * 1.5  # seconds per call on both ranks: they propose intervals of 1

# each rank calls ``any_rank`` as the training loop does, once per step, until it returns True, on a clock of its own
# that advances by a fixed time per call; rank 1 notes a SIGTERM from a given call on, and may come late to one call
_RANK = """
import json, os, sys, time
from datetime import timedelta

import torch
import torch.distributed as dist
import habana_frameworks.torch.distributed.hccl  # registers the hccl backend (the virtual Gaudi's, after torch)

from pytorch_lightning.strategies._sigterm import SigtermAgreement
from virtual_hpu import torch_support

rank = int(os.environ["RANK"])
device = torch.device("hpu", rank)
torch.hpu.set_device(device)
# bound to the HPU as Lightning does, where torch can bind a group to it
dist.init_process_group("hccl", device_id=torch_support.hpu_group_device(device), timeout=timedelta(seconds=60))
late, fast, slow = float(sys.argv[1]), json.loads(sys.argv[2])[rank], float(sys.argv[3])

call = 0  # the call of ``any_rank`` under way, from 1
starts = []  # the calls at which this rank started an exchange
launch = dist.all_reduce


def all_reduce(*args, **kwargs):
    starts.append(call)
    return launch(*args, **kwargs)


dist.all_reduce = all_reduce


def calls(seconds_per_call, noted_from, late_at=0, limit=200):
    global call
    call, reads = 0, []
    starts.clear()

    def clock():
        reads.append(call)
        return call * seconds_per_call

    agreement = SigtermAgreement(clock=clock)
    answers, seconds = [], []
    while not (answers and answers[-1]) and call < limit:
        call += 1
        if rank == 1 and call == late_at:
            time.sleep(late)
        started = time.monotonic()
        answers.append(agreement.any_rank(rank == 1 and call >= noted_from))
        seconds.append(time.monotonic() - started)
    agreement.close()
    return {"answers": answers, "seconds": seconds, "starts": list(starts), "clock_reads": reads}


results = {"fast": calls(fast, noted_from=27), "slow": calls(slow, noted_from=3, late_at=3)}

# closed with an exchange in flight, on the default clock
again = SigtermAgreement()
again.any_rank(rank == 0)
again.close()
dist.destroy_process_group()
print(json.dumps(results), flush=True)
"""


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    script = tmp_path_factory.mktemp("sigterm") / "rank.py"
    script.write_text(_RANK)
    return run_ranks(script, str(LATE), json.dumps(FAST), str(SLOW), timeout=150)


@pytest.mark.parametrize(
    ("seconds_per_call", "interval"),
    [(0.0, _MAX_INTERVAL), (_PERIOD / _MAX_INTERVAL, _MAX_INTERVAL), (FAST[0], 10), (SLOW, 1)],
)
def test_proposed_interval_spaces_exchanges_by_the_period_within_bounds(seconds_per_call, interval):
    assert _proposed_interval(seconds_per_call) == interval


def test_fast_calls_exchange_every_few_calls_at_the_same_calls_on_every_rank(ranks):
    fast = [rank["fast"] for rank in ranks]
    assert fast[0]["starts"] == fast[1]["starts"], fast
    starts = fast[0]["starts"]
    # one call apart until the first timed interval is agreed, then the larger of the two ranks' proposals
    assert starts[:3] == [1, 2, 3], starts
    assert {b - a for a, b in zip(starts[2:], starts[3:])} == {10}, starts
    assert len(starts) < len(fast[0]["answers"]) / 5, fast
    # the calls in between do nothing but count: not even read the clock
    for rank in fast:
        assert rank["clock_reads"] == rank["starts"], rank


def test_a_sigterm_noted_mid_interval_stops_every_rank_at_the_same_call_within_two_intervals(ranks):
    noted, interval = 27, 10
    fast = [rank["fast"] for rank in ranks]
    starts = fast[0]["starts"]
    assert noted not in starts, starts  # noted between two exchanges
    # sent with the first exchange started at or after the call that noted it, the answer comes when it is collected
    sent = min(start for start in starts if start >= noted)
    for rank in fast:
        assert rank["answers"].index(True) + 1 == len(rank["answers"]) == sent + interval, fast
    # the documented bound: a SIGTERM arriving during step k = noted - 1 stops the ranks by step k + N1 + N2
    assert sent + interval <= noted - 1 + 2 * interval
    assert starts[-1] == sent, starts  # nothing started after it: nothing is left in flight


def test_slow_calls_exchange_at_every_call_and_agree_one_call_late_without_waiting_for_each_other(ranks):
    slow = [rank["slow"] for rank in ranks]
    # the same answer on every rank at every call, one call after rank 1 noted it: a SIGTERM arriving during step 2
    # stops both ranks at the start of step 4, as with an exchange at every call
    for rank in slow:
        assert rank["answers"] == [False, False, False, True], slow
        assert rank["starts"] == [1, 2, 3], slow
    # rank 0 got its answer at the third call while rank 1 was still on its way to it: the exchange it collected was
    # the one started at the second call
    assert slow[0]["seconds"][2] < LATE / 2, slow
