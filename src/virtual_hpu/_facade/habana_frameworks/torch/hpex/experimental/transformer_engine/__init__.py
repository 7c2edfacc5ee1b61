"""``habana_frameworks.torch.hpex.experimental.transformer_engine``: fp8 training modules, ``fp8_autocast`` and recipes.

The virtual Gaudi's emulation: values pass through torch's float8 dtypes with the recipe's scales, GEMMs run through
``torch.ops.hpu.fp8_gemm_v2``. Gaudi2 and newer only.
"""

from habana_frameworks.torch.hpex.experimental.transformer_engine import recipe
from habana_frameworks.torch.hpex.experimental.transformer_engine.fp8 import fp8_autocast
from habana_frameworks.torch.hpex.experimental.transformer_engine.module import Linear

__all__ = ["Linear", "fp8_autocast", "recipe"]
