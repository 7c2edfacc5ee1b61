"""``torch.optim.Adam`` with the lazy graph cut around each parameter group's state set-up."""

from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT

from habana_frameworks.torch.hpex.optimizers._markstep import CutAroundStateSetUp


class Adam(CutAroundStateSetUp, torch.optim.Adam):
    """``torch.optim.Adam`` (same update) with the lazy graph cut around each parameter group's state set-up, as
    Gaudi's ``MarkstepAdam`` does. It takes the bridge's arguments: torch's later ``decoupled_weight_decay`` is not
    among them (``AdamW`` is Adam with decoupled weight decay)."""

    def __init__(
        self,
        params: ParamsT,
        lr: Union[float, Tensor] = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        amsgrad: bool = False,
        *,
        foreach: Optional[bool] = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: Optional[bool] = None,
    ) -> None:
        super().__init__(
            params, lr, betas, eps, weight_decay, amsgrad,
            foreach=foreach, maximize=maximize, capturable=capturable, differentiable=differentiable, fused=fused,
        )  # fmt: skip
