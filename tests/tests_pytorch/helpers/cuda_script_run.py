"""A training script as written for CUDA Lightning, run with ``accelerator="hpu"``: it imports ``lightning`` (or, with
``--package pytorch_lightning``, our package) and configures the Trainer the way CUDA scripts do (``--case``; several
cases, comma-separated, train one after another in the same processes, as a script with several Trainers does).

Each rank saves ``rank<N>.pt`` in ``--out/<case>``: the classes the flags resolved to, the settings of the strategy, the
autocast state seen in ``training_step`` and the number of steps trained, so a test compares the two packages and
the CUDA spellings with their HPU equivalents.
"""

import importlib
import os
from argparse import ArgumentParser
from typing import Any, Callable

import torch
from lightning.pytorch.demos.boring_classes import BoringModel


def _cases(L: Any) -> dict[str, Callable[[], dict]]:
    """Trainer arguments of each case, built only for the case that runs."""
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy

    def strategy_precision() -> dict:
        from pytorch_lightning.plugins import HPUPrecisionPlugin
        from pytorch_lightning.strategies import HPUParallelStrategy

        return {"devices": 2, "strategy": HPUParallelStrategy(precision_plugin=HPUPrecisionPlugin("bf16-mixed"))}

    return {
        "ddp": lambda: {"devices": 2, "strategy": "ddp", "precision": "bf16-mixed"},
        "ddp_instance": lambda: {
            "devices": 2,
            "strategy": DDPStrategy(find_unused_parameters=True, gradient_as_bucket_view=True),
        },
        "deepspeed_instance": lambda: {
            "devices": 2,
            # offloading the optimizer needs DeepSpeed's own (DeepSpeedCPUAdam), on CUDA too
            "strategy": DeepSpeedStrategy(stage=3, reduce_bucket_size=12345),
            "precision": "bf16-mixed",
        },
        "devices_list": lambda: {"devices": [0, 1]},
        "strategy_precision": strategy_precision,
        "barebones": lambda: {"devices": 2, "barebones": True},
    }


class Recorder(BoringModel):
    """Records what ``training_step`` runs under."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.seen = {
            "autocast": torch.is_autocast_enabled("hpu"),
            "autocast_dtype": torch.get_autocast_dtype("hpu"),
            "output_dtype": self.layer(batch).dtype,
            "device": str(batch.device),
        }
        return super().training_step(batch, batch_idx)


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--case", required=True)
    parser.add_argument("--package", default="lightning", choices=["lightning", "pytorch_lightning"])
    args = parser.parse_args()
    L = importlib.import_module(args.package)
    for case in args.case.split(","):
        out = os.path.join(args.out, case)
        os.makedirs(out, exist_ok=True)
        _train(L, case, out)


def _train(L: Any, case: str, out: str) -> None:
    flags = _cases(L)[case]()
    flags.setdefault("logger", False)
    if not flags.get("barebones"):
        flags.setdefault("enable_checkpointing", False)
    trainer = L.Trainer(accelerator="hpu", max_steps=2, limit_val_batches=1, **flags)
    model = Recorder()
    trainer.fit(model)
    strategy = trainer.strategy
    result = {
        "classes": {
            "connector": type(trainer._accelerator_connector).__name__,
            "accelerator": type(trainer.accelerator).__name__,
            "strategy": type(strategy).__name__,
            "precision": type(trainer.precision_plugin).__name__,
            "callbacks": sorted(type(callback).__name__ for callback in trainer.callbacks),
        },
        "precision": trainer.precision_plugin.precision,
        "world_size": trainer.world_size,
        "num_devices": trainer.num_devices,
        "global_step": trainer.global_step,
        "seen": model.seen,
        "ddp_kwargs": dict(getattr(strategy, "_ddp_kwargs", {})),
        "zero": strategy.config["zero_optimization"] if hasattr(strategy, "config") and strategy.config else None,
    }
    torch.save(result, os.path.join(out, f"rank{trainer.global_rank}.pt"))


if __name__ == "__main__":
    main()
