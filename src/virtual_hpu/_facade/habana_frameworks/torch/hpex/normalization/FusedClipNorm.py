"""Gradient clipping by the total L2 norm in one device op."""

from typing import Iterable, Union

import torch

from habana_frameworks.torch.core import step_closure
from habana_frameworks.torch.utils.internal import is_lazy


class FusedClipNorm:
    """Gaudi's fused gradient clipping: ``FusedClipNorm(params, max_norm).clip_norm(params)`` scales all gradients by
    ``max_norm / (total_norm + 1e-6)`` when that is below 1, in one op, and returns the total L2 norm as a
    one-element tensor in the first parameter's dtype (a CPU zero when no parameter has a gradient). Only the norm
    type 2 exists. Values are ``torch.nn.utils.clip_grad_norm_``'s; in lazy mode a total that is not above
    ``max_norm`` (NaN included) leaves the gradients as they are. The parameters given to the constructor only
    choose the dtype."""

    def __init__(self, parameters: Iterable[torch.nn.parameter.Parameter], max_norm: float) -> None:
        params = list(parameters)
        self.dtype = params[0].dtype if params else torch.float32
        self.max_norm_t = torch.full((1,), max_norm, dtype=self.dtype, device="hpu")
        self.max_norm = max_norm
        self.norm_type = 2.0

    def clip_norm(self, parameters: Union[torch.Tensor, Iterable[torch.Tensor]]) -> torch.Tensor:
        """Clip the gradients of ``parameters`` (one tensor or several) in place and return their total norm."""
        step_closure._mark_step_if_lazy()
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return torch.tensor(0.0)
        with torch.no_grad():
            if is_lazy():
                total_norm = torch.ops.hpu.fused_norm_lazy(grads, self.max_norm_t, self.norm_type)
            else:
                # the op writes the total norm into the list's last tensor
                grads.append(torch.zeros(1, dtype=self.dtype, device="hpu"))
                total_norm = torch.ops.hpu.fused_clip_norm(grads, self.max_norm_t, self.norm_type)
        step_closure._mark_step_if_lazy()
        return total_norm
