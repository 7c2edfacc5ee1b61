"""``Trainer(sync_batchnorm=True)`` on 2 HPUs: torch's ``SyncBatchNorm`` normalises over the whole batch of all ranks,
so 2 ranks train like one process on their union (upstream's CPU DDP refuses ``SyncBatchNorm``, hence that
reference)."""

import lightning as L
import pytest
from lightning.pytorch.utilities.exceptions import MisconfigurationException

import pytorch_lightning as pl
from tests_pytorch.helpers.multi_device_run import Normalised, weights
from tests_pytorch.helpers.processes import rank_results, wait
from tests_pytorch.multi_device.test_trainer_patterns import assert_close, launch
from virtual_hpu import torch_support

_TAKES_HPU = torch_support.sync_batchnorm_takes_hpu()


@pytest.mark.skipif(not _TAKES_HPU, reason="torch's SyncBatchNorm takes hpu tensors from torch 2.10; refused below")
def test_two_ranks_normalise_over_the_whole_batch(tmp_path):
    wait(launch(tmp_path / "run", "sync_batchnorm"))
    ranks = rank_results(tmp_path / "run")
    union = Normalised(batch_size=4)
    flags = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, limit_val_batches=0, **flags).fit(union)
    for observed in ranks:
        assert observed["norm"] == "SyncBatchNorm"
        # running mean and (unbiased) variance included
        assert_close(observed["weights"], weights(union), tolerance=1e-5)


@pytest.mark.skipif(_TAKES_HPU, reason="this torch's SyncBatchNorm takes hpu tensors")
@pytest.mark.parametrize("trainer_class", [pl.Trainer, L.Trainer])
def test_refused_before_any_process_starts_where_torch_cannot_normalise_hpu_tensors(trainer_class):
    with pytest.raises(MisconfigurationException, match=r"`Trainer\(sync_batchnorm=True\)` on HPUs needs torch 2\.10"):
        trainer_class(accelerator="hpu", devices=2, sync_batchnorm=True)
    # without it, as with another accelerator, the Trainer is built
    assert trainer_class(accelerator="hpu", devices=2, logger=False).num_devices == 2
    assert trainer_class(accelerator="cpu", devices=2, sync_batchnorm=True, logger=False).num_devices == 2
