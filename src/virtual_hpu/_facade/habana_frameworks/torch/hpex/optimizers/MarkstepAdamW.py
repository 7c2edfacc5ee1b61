"""``torch.optim.AdamW`` with the lazy graph cut around each parameter group's state set-up."""

from typing import Optional, Union

import torch
from torch import Tensor

from habana_frameworks.torch import core as htcore


class AdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` (same arguments and update) that cuts the lazy graph before and after it gathers each
    parameter group's tensors and creates their state, as Gaudi's ``MarkstepAdamW`` does."""

    def __init__(
        self,
        params,
        lr: Union[float, Tensor] = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: Optional[bool] = None,
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
            maximize=maximize,
            foreach=foreach,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
        )

    def _init_group(self, *args, **kwargs):
        htcore.mark_step()
        has_complex = super()._init_group(*args, **kwargs)
        htcore.mark_step()
        return has_complex
