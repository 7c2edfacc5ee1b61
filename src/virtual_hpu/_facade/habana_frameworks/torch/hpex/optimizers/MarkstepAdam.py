"""``torch.optim.Adam`` with the lazy graph cut around each parameter group's state set-up."""

from typing import Optional, Union

import torch
from torch import Tensor

from habana_frameworks.torch import core as htcore


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` (same arguments and update) that cuts the lazy graph before and after it gathers each
    parameter group's tensors and creates their state, so a first step's state creation and the update compile as
    separate graphs, as Gaudi's ``MarkstepAdam`` does."""

    def __init__(
        self,
        params,
        lr: Union[float, Tensor] = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
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
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            foreach=foreach,
            maximize=maximize,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
        )

    def _init_group(self, *args, **kwargs):
        htcore.mark_step()
        has_complex = super()._init_group(*args, **kwargs)
        htcore.mark_step()
        return has_complex
