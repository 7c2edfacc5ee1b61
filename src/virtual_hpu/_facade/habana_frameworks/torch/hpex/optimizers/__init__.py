"""``habana_frameworks.torch.hpex.optimizers``: Gaudi's fused optimizers.

On a Gaudi each update is one TPC kernel per parameter group; on the virtual Gaudi it is the published algorithm in
torch ops, so a step equals the matching ``torch.optim`` optimizer (LAMB and LARS, which torch lacks, follow the
papers as the bridge's kernels compute them). The lazy graph is cut where the bridge cuts it.
"""

from habana_frameworks.torch.hpex.optimizers.FusedAdagrad import FusedAdagrad
from habana_frameworks.torch.hpex.optimizers.FusedAdamW import FusedAdamW
from habana_frameworks.torch.hpex.optimizers.FusedLamb import FusedLamb
from habana_frameworks.torch.hpex.optimizers.FusedLars import FusedLars
from habana_frameworks.torch.hpex.optimizers.FusedResourceApplyMomentum import FusedResourceApplyMomentum
from habana_frameworks.torch.hpex.optimizers.FusedSGD import FusedSGD
from habana_frameworks.torch.hpex.optimizers.MarkstepAdam import Adam
from habana_frameworks.torch.hpex.optimizers.MarkstepAdamW import AdamW

__all__ = [
    "Adam",
    "AdamW",
    "FusedAdagrad",
    "FusedAdamW",
    "FusedLamb",
    "FusedLars",
    "FusedResourceApplyMomentum",
    "FusedSGD",
]
