"""``habana_frameworks.torch.hpex.hmp``: Habana Mixed Precision, the bf16 mixed precision of Gaudi software before
1.13 and of Lightning 1.x (``hmp.convert(...)`` once, then every op in its lists runs in bf16 or fp32).

Gaudi software removed HMP in 1.13 in favour of ``torch.autocast("hpu")``, so on a Gaudi with current software this
import fails; the virtual Gaudi keeps it for older scripts and maps it onto autocast (see ``convert``). New code
uses ``torch.autocast("hpu", dtype=torch.bfloat16)`` or ``Trainer(precision="bf16-mixed")``.
"""

from habana_frameworks.torch.hpex.hmp.hmp import convert
from habana_frameworks.torch.hpex.hmp.utils import disable_casts

__all__ = ["convert", "disable_casts"]
