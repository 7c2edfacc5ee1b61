"""``habana_frameworks.torch.hpex.movingavrg``: Gaudi's fused exponential moving average of a model's weights."""

from habana_frameworks.torch.hpex.movingavrg.FusedEMA import FusedEMA

__all__ = ["FusedEMA"]
