"""``habana_frameworks.torch.hpex.optimizers.distributed``: functional optimizers for ``torch.distributed.optim``."""

from habana_frameworks.torch.hpex.optimizers.distributed.FusedAdamW import FusedAdamW

__all__ = ["FusedAdamW"]
