"""fp8 training on Gaudi2 and newer: Intel Gaudi's Transformer Engine modules compute in fp8 inside ``fp8_autocast``,
every other op follows bf16 autocast."""

from collections.abc import Generator
from contextlib import contextmanager
from typing import Any, Optional

import torch
from torch import nn


def transformer_engine() -> Any:
    """Gaudi's Transformer Engine, importable once the (virtual) Gaudi is loaded."""
    from habana_frameworks.torch.hpex.experimental import transformer_engine

    return transformer_engine


def uses_transformer_engine(module: nn.Module) -> bool:
    """Whether any submodule is a Transformer Engine module (the user's own, or from an earlier conversion)."""
    return any(type(child).__module__.startswith(transformer_engine().__name__) for child in module.modules())


def replace_linear_layers(module: nn.Module) -> tuple[list[str], list[str]]:
    """Swap each ``torch.nn.Linear`` in ``module`` for a Transformer Engine ``Linear`` with the same weights and bias,
    in the same dtype, on the same device. Returns the qualified names of the layers replaced and of those left.

    Subclasses of ``Linear`` are left: their owners may use the weight directly rather than call the layer
    (``nn.MultiheadAttention.out_proj``), so an fp8 layer in their place would never run.
    """
    te = transformer_engine()
    replaced, left = [], []
    for owner_name, owner in list(module.named_modules()):
        for name, child in list(owner.named_children()):
            qualified = f"{owner_name}.{name}" if owner_name else name
            if not isinstance(child, nn.Linear):
                continue
            if type(child) is not nn.Linear:
                left.append(qualified)
                continue
            replacement = te.Linear(
                child.in_features,
                child.out_features,
                bias=child.bias is not None,
                params_dtype=child.weight.dtype,
                device=child.weight.device,
            )
            with torch.no_grad():
                replacement.weight.copy_(child.weight)
                if child.bias is not None:
                    replacement.bias.copy_(child.bias)
            replacement.weight.requires_grad_(child.weight.requires_grad)
            setattr(owner, name, replacement)
            replaced.append(qualified)
    return replaced, left


@contextmanager
def fp8_training_context(recipe: Any, group: Optional[Any] = None) -> Generator[None, None, None]:
    """bf16 autocast for the ops Transformer Engine does not cover, fp8 with ``recipe`` for its modules; amaxes are
    reduced over ``group`` (all ranks when ``None``) when the recipe asks."""
    with (
        torch.autocast(device_type="hpu", dtype=torch.bfloat16),
        transformer_engine().fp8_autocast(enabled=True, fp8_recipe=recipe, fp8_group=group),
    ):
        yield
