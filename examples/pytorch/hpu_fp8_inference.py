"""fp8 inference on Intel Gaudi (Gaudi2 and newer) with Intel Neural Compressor, in three runs.

1. ``train``: train the digit classifier of ``hpu_classifier.py`` in bf16 and save its weights.
2. ``measure``: measure the tensors of the trained model on calibration data (the validation set); the statistics are
   written under ``--fp8-data-path`` when ``predict`` ends.
3. ``quantize``: in a new process, quantize the model from those statistics and test it, beside the bf16 model.

On a machine without Gaudi, run it on the virtual Gaudi::

    VIRTUAL_HPU=1 python examples/pytorch/hpu_fp8_inference.py train --workdir fp8_demo
    VIRTUAL_HPU=1 python examples/pytorch/hpu_fp8_inference.py measure --workdir fp8_demo
    VIRTUAL_HPU=1 python examples/pytorch/hpu_fp8_inference.py quantize --workdir fp8_demo
"""

import json
from argparse import ArgumentParser
from pathlib import Path

import torch
from hpu_classifier import DigitsClassifier, DigitsDataModule

import pytorch_lightning as pl
from pytorch_lightning.plugins import HPUPrecisionPlugin


def _trainer(plugin: HPUPrecisionPlugin, **kwargs) -> pl.Trainer:
    return pl.Trainer(
        accelerator="hpu",
        devices=1,
        plugins=[plugin],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def _trained(workdir: Path) -> DigitsClassifier:
    model = DigitsClassifier()
    model.load_state_dict(torch.load(workdir / "bf16_weights.pt"))
    return model


def _test(model: DigitsClassifier, plugin: HPUPrecisionPlugin, data: DigitsDataModule) -> tuple:
    """Test accuracy and the logits of the test set."""
    trainer = _trainer(plugin)
    (metrics,) = trainer.test(model, datamodule=data, verbose=False)
    batches = trainer.predict(model, dataloaders=data.test_dataloader())
    return metrics["test_acc"], torch.cat([logits.float().cpu() for logits in batches])


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["train", "measure", "quantize"])
    parser.add_argument("--workdir", type=Path, default=Path("fp8_demo"))
    parser.add_argument("--max-epochs", type=int, default=8)
    parser.add_argument("--fp8-data-path", default=None, help="default: <workdir>/hqt_output")
    args = parser.parse_args()
    fp8_data_path = args.fp8_data_path or str(args.workdir / "hqt_output")
    pl.seed_everything(42)
    data = DigitsDataModule()

    if args.step == "train":
        model = DigitsClassifier()
        _trainer(HPUPrecisionPlugin("bf16-mixed"), max_epochs=args.max_epochs).fit(model, datamodule=data)
        args.workdir.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), args.workdir / "bf16_weights.pt")
        print(f"bf16 weights saved in {args.workdir / 'bf16_weights.pt'}")

    elif args.step == "measure":
        plugin = HPUPrecisionPlugin(precision="fp8")
        model = plugin.convert_modules(_trained(args.workdir), inference=True, quant=False, fp8_data_path=fp8_data_path)
        data.setup("fit")
        _trainer(plugin).predict(model, dataloaders=data.val_dataloader())
        print(f"measurements written: {sorted(p.name for p in Path(fp8_data_path).glob('measure_hooks_*'))}")

    else:
        bf16_accuracy, bf16_logits = _test(_trained(args.workdir), HPUPrecisionPlugin("bf16-mixed"), data)
        plugin = HPUPrecisionPlugin(precision="fp8")
        model = plugin.convert_modules(_trained(args.workdir), inference=True, quant=True, fp8_data_path=fp8_data_path)
        fp8_accuracy, fp8_logits = _test(model, plugin, data)
        results = {
            "bf16_test_acc": bf16_accuracy,
            "fp8_test_acc": fp8_accuracy,
            "max_logit_difference": (fp8_logits - bf16_logits).abs().max().item(),
            "max_logit": bf16_logits.abs().max().item(),
            "same_prediction": (fp8_logits.argmax(-1) == bf16_logits.argmax(-1)).float().mean().item(),
        }
        (args.workdir / "fp8_inference.json").write_text(json.dumps(results, indent=2))
        print(", ".join(f"{name}={value:.4f}" for name, value in results.items()))


if __name__ == "__main__":
    main()
