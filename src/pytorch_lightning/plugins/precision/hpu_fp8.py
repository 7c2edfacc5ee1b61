"""fp8 training on Gaudi2 and newer in the Trainer: Intel Gaudi's Transformer Engine modules compute in fp8 inside
``fp8_autocast``, every other op follows bf16 autocast."""

from lightning_fabric.plugins.precision.hpu_fp8 import HPUFP8Precision as FabricHPUFP8Precision
from pytorch_lightning.plugins.precision.hpu_mixed import HPUMixedPrecision


class HPUFP8Precision(FabricHPUFP8Precision, HPUMixedPrecision, builds=("fp8",)):
    """fp8 training on HPUs (Gaudi2 and newer) with Gaudi's Transformer Engine: Fabric's
    :class:`lightning_fabric.plugins.HPUFP8Precision` with the Trainer's hooks.

    Transformer Engine modules compute in fp8 with ``recipe``; every other op runs in bf16 autocast, with Gaudi's op
    lists as in :class:`HPUMixedPrecision`. With ``replace_layers=True`` the model's ``torch.nn.Linear`` layers become
    Transformer Engine ``Linear`` layers holding the same weights when the Trainer sets the model up, so
    ``Trainer(plugins=[HPUFP8Precision(replace_layers=True)])`` is all a model needs. ``Trainer(precision="fp8")`` and
    ``HPUPrecisionPlugin(precision="fp8", ...)`` build it too.

    Args:
        precision: ``"fp8"``.
        recipe: the fp8 recipe: a ``transformer_engine.recipe.DelayedScaling``, or its arguments as a dict
            (``{"fp8_format": "HYBRID", "amax_history_len": 16}``, as from a config file); Transformer Engine's default
            ``DelayedScaling()`` when not given.
        replace_layers: put Transformer Engine ``Linear`` layers in place of the model's ``torch.nn.Linear`` layers at
            set-up. A model that already has Transformer Engine modules is left as it is.
        opt_level, bf16_file_path, fp32_file_path, verbose, hmp_params: Gaudi's op lists for the bf16 ops.
    """
