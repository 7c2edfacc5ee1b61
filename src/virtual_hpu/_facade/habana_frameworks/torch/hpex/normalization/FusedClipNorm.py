"""Gradient clipping by the total L2 norm, as ``torch.nn.utils.clip_grad_norm_``."""

from typing import Iterable, Union

import torch

from habana_frameworks.torch.core import step_closure


class FusedClipNorm:
    """Gaudi's fused gradient clipping: ``FusedClipNorm(params, max_norm).clip_norm(params)`` scales the gradients
    by ``max_norm / (total_norm + 1e-6)`` when that is below 1 and returns the total L2 norm of the gradients, as
    ``torch.nn.utils.clip_grad_norm_(params, max_norm)`` does (0 when no parameter has a gradient). The norm type
    is 2, as on Gaudi."""

    def __init__(self, parameters: Iterable[torch.nn.parameter.Parameter], max_norm: float) -> None:
        params = list(parameters)
        # the bridge keeps max_norm as a device tensor in the parameters' dtype
        self.dtype = params[0].dtype if params else torch.float32
        self.max_norm_t = torch.full((1,), max_norm, dtype=self.dtype, device="hpu")
        self.max_norm = max_norm
        self.norm_type = 2.0

    def clip_norm(self, parameters: Union[torch.Tensor, Iterable[torch.Tensor]]) -> torch.Tensor:
        """Clip the gradients of ``parameters`` in place and return their total norm."""
        step_closure._mark_step_if_lazy()
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        params = [p for p in params if p.grad is not None]
        if not params:
            return torch.tensor(0.0)
        total_norm = torch.nn.utils.clip_grad_norm_(params, self.max_norm, norm_type=self.norm_type)
        step_closure._mark_step_if_lazy()
        return total_norm
