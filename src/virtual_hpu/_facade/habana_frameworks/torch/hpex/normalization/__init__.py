"""``habana_frameworks.torch.hpex.normalization``: Gaudi's fused RMSNorm and gradient-norm clipping."""

from habana_frameworks.torch.hpex.normalization.FusedClipNorm import FusedClipNorm
from habana_frameworks.torch.hpex.normalization.FusedRMSNorm import FusedRMSNorm, RmsNormBwdMode

__all__ = ["FusedClipNorm", "FusedRMSNorm", "RmsNormBwdMode"]
