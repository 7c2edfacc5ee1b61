"""An unmodified upstream-style Lightning script runs through ``pytorch_lightning`` on CPU."""

import torch

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.demos.boring_classes import BoringDataModule, BoringModel


class LoggingModel(BoringModel):
    def validation_step(self, batch, batch_idx):
        output = super().validation_step(batch, batch_idx)
        self.log("val_loss", output["x"])
        return output

    def test_step(self, batch, batch_idx):
        output = super().test_step(batch, batch_idx)
        self.log("test_loss", output["y"])
        return output


def _trainer(tmp_path, **kwargs) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        default_root_dir=tmp_path,
        limit_train_batches=4,
        limit_val_batches=2,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        **kwargs,
    )


def test_all_stages_checkpoint_and_reload(tmp_path):
    pl.seed_everything(1)
    model, data = LoggingModel(), BoringDataModule()
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer = _trainer(tmp_path, max_epochs=2, callbacks=[checkpoint])
    trainer.fit(model, datamodule=data)
    assert trainer.state.finished and trainer.global_step == 8

    (validated,) = trainer.validate(model, datamodule=data, verbose=False)
    (tested,) = trainer.test(model, datamodule=data, verbose=False)
    predictions = trainer.predict(model, datamodule=data)
    assert validated["val_loss"] > 0 and tested["test_loss"] > 0
    assert len(predictions) > 0 and predictions[0].shape[-1] == 2

    assert checkpoint.last_model_path.endswith("last.ckpt")
    reloaded = LoggingModel.load_from_checkpoint(checkpoint.last_model_path)
    for before, after in zip(model.state_dict().values(), reloaded.state_dict().values()):
        torch.testing.assert_close(before, after, rtol=0, atol=0)


def test_resume_continues_where_it_stopped(tmp_path):
    pl.seed_everything(1)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    _trainer(tmp_path, max_epochs=1, callbacks=[checkpoint]).fit(BoringModel(), datamodule=BoringDataModule())

    resumed = _trainer(tmp_path, max_epochs=3)
    resumed.fit(BoringModel(), datamodule=BoringDataModule(), ckpt_path=checkpoint.last_model_path)
    assert resumed.current_epoch == 3
    assert resumed.global_step == 12  # 4 steps from the first run, 8 after resuming
