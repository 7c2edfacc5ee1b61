"""fp8 inference on Gaudi2 and newer in the Trainer, with Intel Neural Compressor: one process measures the model's
tensors, a later one quantizes the model from those measurements."""

from lightning_fabric.plugins.precision.hpu_fp8_inference import (
    HPUFP8InferencePrecision as FabricHPUFP8InferencePrecision,
)
from pytorch_lightning.plugins.precision.hpu_mixed import HPUMixedPrecision


class HPUFP8InferencePrecision(FabricHPUFP8InferencePrecision, HPUMixedPrecision):
    """fp8 inference on HPUs (Gaudi2 and newer) with Intel Neural Compressor, in two processes.

    In the first, ``quant=False`` puts measuring modules into the model when the Trainer sets it up; ``predict`` or
    ``test`` then gathers the statistics of its tensors, written under ``fp8_data_path`` when the stage succeeds. In a
    later process, ``quant=True`` quantizes the model from those statistics at set-up. Other ops run in bf16 autocast.
    ``HPUFP8Precision().convert_modules(model, inference=True, ...)`` (lightning-habana's way) does the same at once.

    Args:
        quant: ``True`` (quantize) or ``False`` (measure) with the JSON configuration that ``QUANT_CONFIG`` names, or
            else the packaged maxabs ones; or the path of an Intel Neural Compressor JSON configuration, or such a
            configuration as a dict (its ``mode`` decides). Files are never modified.
        fp8_data_path: the folder of the measurements; the configuration's ``dump_stats_path``, or else
            ``./hqt_output``, when not given.
    """
