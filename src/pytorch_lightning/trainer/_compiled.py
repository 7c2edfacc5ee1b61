"""Compiled LightningModules in the Trainer: run with Gaudi's compile backend, and ``self.log`` out of dynamo's trace.

For a ``torch.compile``d LightningModule, Lightning 2.6 compiles its step methods too. From torch 2.12 on, dynamo
traces into the signature check inside ``self.log`` and fails ("'method' object has no attribute '__dict__'",
Lightning issue #21836); upstream fixed it after 2.6.6 by excluding ``log`` from compilation. Until a release with
the fix is required, the Trainer does the same for the module it runs. Logging is host-side bookkeeping either way.
"""

from typing import Any

import torch
from lightning.pytorch import LightningModule

from lightning_fabric.strategies._hpu_compile import hpu_compile_arguments, is_lazy, recorded_arguments


def run_lightning_module_for_hpu(module: Any) -> None:
    """For the Trainer's HPU strategies: have a compiled LightningModule (``_compiler_ctx`` set by the Trainer) run
    with the backend :mod:`lightning_fabric.strategies._hpu_compile` chooses, recompiling it with Lightning's
    ``to_uncompiled`` / ``from_compiled``."""
    from lightning.pytorch.utilities.compile import from_compiled, to_uncompiled

    context = getattr(module, "_compiler_ctx", None)
    if context is None:
        return
    recorded = recorded_arguments(context["dynamo_ctx"])
    arguments = hpu_compile_arguments(recorded, is_lazy())
    if arguments is not recorded:
        to_uncompiled(module)
        if arguments is not None:
            from_compiled(torch.compile(module, **arguments))
    # upstream's Trainer, which `lightning.Trainer` is, leaves `log` compiled
    keep_logging_eager(module)


def keep_logging_eager(module: LightningModule) -> None:
    """Exclude ``log`` and ``log_dict`` of a module that Lightning runs compiled from compilation."""
    if getattr(module, "_compiler_ctx", None) is None:
        return
    for name in ("log", "log_dict"):
        if name not in vars(module):
            setattr(module, name, torch.compiler.disable(getattr(module, name)))
