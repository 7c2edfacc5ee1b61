"""fp8 training of a model on Gaudi2 and newer: Intel Gaudi's Transformer Engine modules compute in fp8 inside
``fp8_autocast``, every other op follows bf16 autocast. Functions of the model, used by the fp8 precision plugins."""

from collections.abc import Generator, Mapping
from contextlib import contextmanager
from typing import Any, Optional, Union

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_info
from torch import nn


def transformer_engine() -> Any:
    """Gaudi's Transformer Engine, importable once the (virtual) Gaudi is loaded."""
    from habana_frameworks.torch.hpex.experimental import transformer_engine

    return transformer_engine


def fp8_recipe(recipe: Optional[Union[Mapping[str, Any], Any]]) -> Any:
    """A ``DelayedScaling`` recipe from one, from its arguments as a mapping (formats by name), or the default."""
    if recipe is None or not isinstance(recipe, Mapping):
        return recipe
    te_recipe = transformer_engine().recipe
    arguments = dict(recipe)
    if isinstance(arguments.get("fp8_format"), str):
        name = arguments["fp8_format"]
        if name not in te_recipe.Format.__members__:
            raise ValueError(
                f"The fp8 recipe's `fp8_format={name!r}` is not a format: use one of"
                f" {', '.join(map(repr, te_recipe.Format.__members__))}."
            )
        arguments["fp8_format"] = te_recipe.Format[name]
    return te_recipe.DelayedScaling(**arguments)


def uses_transformer_engine(module: nn.Module) -> bool:
    """Whether any submodule is a Transformer Engine module (the user's own, or from an earlier conversion)."""
    # by the classes it exports: from bridge 1.19 on, they are defined in ``intel_transformer_engine`` and only
    # re-exported under ``habana_frameworks``
    exported = vars(transformer_engine()).values()
    modules = tuple(value for value in exported if isinstance(value, type) and issubclass(value, nn.Module))
    return any(isinstance(child, modules) for child in module.modules())


def prepare_for_fp8_training(module: nn.Module, replace_layers: bool) -> None:
    """Swap the linear layers of ``module`` for Transformer Engine ones if asked; say so when nothing in it would
    compute in fp8."""
    if replace_layers:
        replace_linear_layers(module)
    elif not uses_transformer_engine(module):
        rank_zero_info(
            "`precision='fp8'`: the model has no Transformer Engine modules, so it trains in bf16. Pass"
            " `HPUPrecisionPlugin(precision='fp8', replace_layers=True)` to put them in place of its linear layers."
        )


def replace_linear_layers(module: nn.Module) -> nn.Module:
    """Swap each ``torch.nn.Linear`` in ``module`` for a Transformer Engine ``Linear`` with the same weights and bias,
    in the same dtype, on the same device; a module that already has Transformer Engine modules is left as it is.

    Subclasses of ``Linear`` are left: their owners may use the weight directly rather than call the layer
    (``nn.MultiheadAttention.out_proj``), so an fp8 layer in their place would never run.
    """
    if uses_transformer_engine(module):
        rank_zero_info("The model already has Transformer Engine modules: its layers are left as they are.")
        return module
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
            # a frozen layer stays frozen
            replacement.weight.requires_grad_(child.weight.requires_grad)
            if child.bias is not None:
                replacement.bias.requires_grad_(child.bias.requires_grad)
            setattr(owner, name, replacement)
            replaced.append(qualified)
    rank_zero_info(f"fp8: {len(replaced)} linear layers now compute in fp8 with Transformer Engine.")
    if left:
        rank_zero_info(f"fp8: left in bf16 autocast, as their owners use the weights directly: {', '.join(left)}")
    return module


@contextmanager
def fp8_training_context(recipe: Any) -> Generator[None, None, None]:
    """bf16 autocast for the ops Transformer Engine does not cover, fp8 with ``recipe`` for its modules; amaxes are
    reduced over all ranks when the recipe asks."""
    with (
        torch.autocast(device_type="hpu", dtype=torch.bfloat16),
        transformer_engine().fp8_autocast(enabled=True, fp8_recipe=recipe),
    ):
        yield
