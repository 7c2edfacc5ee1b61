"""fp8 on Gaudi2 and newer. Training: Intel Gaudi's Transformer Engine modules compute in fp8 inside
``fp8_autocast``, every other op follows bf16 autocast. Inference: Intel Neural Compressor's measured, then quantized
modules (``hpu_fp8_inference``)."""

from collections.abc import Generator
from contextlib import contextmanager
from typing import Any, Optional, Union

import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import nn

from pytorch_lightning.plugins.precision import hpu_fp8_inference


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
            # a frozen layer stays frozen
            replacement.weight.requires_grad_(child.weight.requires_grad)
            if child.bias is not None:
                replacement.bias.requires_grad_(child.bias.requires_grad)
            setattr(owner, name, replacement)
            replaced.append(qualified)
    return replaced, left


@contextmanager
def fp8_training_context(recipe: Any) -> Generator[None, None, None]:
    """bf16 autocast for the ops Transformer Engine does not cover, fp8 with ``recipe`` for its modules; amaxes are
    reduced over all ranks when the recipe asks."""
    with (
        torch.autocast(device_type="hpu", dtype=torch.bfloat16),
        transformer_engine().fp8_autocast(enabled=True, fp8_recipe=recipe),
    ):
        yield


class FP8Conversion:
    """``convert_modules`` of the HPU precision plugins, the fp8 recipe it records for their forward context, and the
    statistics of an fp8 measurement, written when a Trainer stage (``predict``, ``test``, ...) has succeeded."""

    precision: str
    recipe: Optional[Any] = None  # Transformer Engine's default ``DelayedScaling()`` when none is given
    # set by ``convert_modules(inference=True)``
    fp8_inference: Optional[hpu_fp8_inference.FP8InferenceConfig] = None
    _measurement: Optional[hpu_fp8_inference.Measurement] = None

    def convert_modules(
        self,
        module: nn.Module,
        inference: bool = False,
        replace_layers: bool = False,
        recipe: Optional[Any] = None,
        quant: Union[bool, str, dict] = True,
        fp8_data_path: Optional[str] = None,
    ) -> nn.Module:
        """Prepare ``module`` for fp8 training or inference (``precision="fp8"`` only) and return it.

        Args:
            module: the model, before ``fit``, ``predict`` or ``test``.
            inference: prepare for fp8 inference with Intel Neural Compressor instead of training: with ``quant=False``
                measure the model's tensors during ``predict``/``test`` (the statistics are written when it ends),
                with ``quant=True``, in a later process, quantize it from those statistics.
            replace_layers: put Transformer Engine ``Linear`` layers, holding the same weights, in place of the
                model's ``torch.nn.Linear`` layers. A model that already has Transformer Engine modules is left as it
                is.
            recipe: the fp8 recipe, e.g. ``recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID)``; Transformer
                Engine's default ``DelayedScaling()`` when not given.
            quant: for fp8 inference: ``True`` (quantize) or ``False`` (measure) with the JSON configuration that
                ``QUANT_CONFIG`` names, or else the packaged maxabs ones; or the path of an Intel Neural Compressor JSON
                configuration, or such a configuration as a dict (its ``mode`` decides). Files are never modified.
            fp8_data_path: the folder of the measurements, written when measuring and read when quantizing; the
                configuration's ``dump_stats_path``, or else ``./hqt_output``, when not given.
        """
        if self.precision != "fp8":
            raise MisconfigurationException(
                f"`convert_modules` prepares a model for fp8, but this plugin has `precision={self.precision!r}`."
                f" Create it with `{type(self).__name__}(precision='fp8')`."
            )
        if inference:
            config = hpu_fp8_inference.resolve_config(quant, fp8_data_path)
            converted, self._measurement = hpu_fp8_inference.convert_for_inference(module, config)
            self.fp8_inference = config
            return converted
        self.recipe = recipe
        if not replace_layers:
            return module
        if uses_transformer_engine(module):
            rank_zero_info("The model already has Transformer Engine modules: its layers are left as they are.")
            return module
        replaced, left = replace_linear_layers(module)
        rank_zero_info(f"fp8: {len(replaced)} linear layers now compute in fp8 with Transformer Engine.")
        if left:
            rank_zero_info(f"fp8: left in bf16 autocast, as their owners use the weights directly: {', '.join(left)}")
        return module

    def write_fp8_measurements(self) -> None:
        """Write what an fp8 measurement has gathered so far; the Trainer calls it when a stage has succeeded, so that a
        failed run leaves ``fp8_data_path`` as it was."""
        if self._measurement is not None:
            self._measurement.write()

    def say_if_nothing_computes_in_fp8(self, module: nn.Module) -> None:
        if self.fp8_inference is None and not uses_transformer_engine(module):
            rank_zero_info(
                "`precision='fp8'`: the model has no Transformer Engine modules, so it trains in bf16. Call"
                " `plugin.convert_modules(model, replace_layers=True)` before `fit`, or build it with them."
            )
