"""The upstream hooks that ``strategies/_sigterm.py`` overrides still exist and are still used, and our ``Trainer``
uses its loop and signal connector. (Behaviour: ``reliability/test_sigterm.py``, ``models/test_hpu.py``.)"""

import inspect

import pytest
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop as _UpstreamTrainingEpochLoop

import pytorch_lightning as pl
from pytorch_lightning.strategies._sigterm import OVERRIDDEN_UPSTREAM_HOOKS, _SignalConnector, _TrainingEpochLoop


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
