"""An exponential moving average of a model's state, with the decay ramped up over the first updates (the model EMA
of YOLOv5 and its relatives)."""

import math
from copy import deepcopy

import torch
from torch import nn

from habana_frameworks.torch.core import step_closure


def _unwrapped(model: nn.Module) -> nn.Module:
    parallel = (nn.parallel.DataParallel, nn.parallel.DistributedDataParallel)
    return model.module if type(model) in parallel else model


class FusedEMA:
    """Gaudi's fused model EMA. ``FusedEMA(model, decay=0.9999, updates=0)`` keeps ``ema``, an eval-mode copy of
    ``model``; each ``update(model)`` counts an update ``n`` and sets every floating-point entry of the copy's state
    dict to ``d * ema + (1 - d) * model`` with ``d = decay * (1 - exp(-n / 2000))``. Integer entries (batch norm's
    batch counts) keep the copy's value. ``update_attr(model)`` copies the model's public attributes to ``ema``."""

    def __init__(self, model: nn.Module, decay: float = 0.9999, updates: float = 0) -> None:
        if decay < 0.0:
            raise ValueError(f"Invalid decay value: {decay}")
        self.ema = deepcopy(_unwrapped(model)).eval()
        self.decay = lambda updates: decay * (1 - math.exp(-updates / 2000))
        self.updates = updates
        self.updated_ema = list(self.ema.state_dict().values())

    def update(self, model: nn.Module) -> None:
        step_closure._mark_step_if_lazy()
        self.updates += 1
        decay = self.decay(self.updates)
        with torch.no_grad():
            for average, value in zip(self.updated_ema, model.state_dict().values()):
                if average.dtype.is_floating_point:
                    average.mul_(decay).add_(value.detach().to(average.dtype), alpha=1 - decay)
        step_closure._mark_step_if_lazy()

    def update_attr(self, model: nn.Module, include=(), exclude=("process_group", "reducer")) -> None:
        for name, value in model.__dict__.items():
            if (include and name not in include) or name.startswith("_") or name in exclude:
                continue
            setattr(self.ema, name, value)
