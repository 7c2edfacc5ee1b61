"""Compiled LightningModules that log: ``self.log`` stays out of dynamo's trace.

For a ``torch.compile``d LightningModule, Lightning 2.6 compiles its step methods too. From torch 2.12 on, dynamo
traces into the signature check inside ``self.log`` and fails ("'method' object has no attribute '__dict__'",
Lightning issue #21836); upstream fixed it after 2.6.6 by excluding ``log`` from compilation. Until a release with
the fix is required, the Trainer does the same for the module it runs. Logging is host-side bookkeeping either way.
"""

import torch
from lightning.pytorch import LightningModule


def keep_logging_eager(module: LightningModule) -> None:
    """Exclude ``log`` and ``log_dict`` of a module that Lightning runs compiled from compilation."""
    if getattr(module, "_compiler_ctx", None) is None:
        return
    for name in ("log", "log_dict"):
        if name not in vars(module):
            setattr(module, name, torch.compiler.disable(getattr(module, name)))
