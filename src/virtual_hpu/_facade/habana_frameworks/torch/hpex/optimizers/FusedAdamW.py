"""AdamW (decoupled weight decay), as ``torch.optim.AdamW``, with optional bias correction and moment dtypes."""

from typing import Callable, Iterable, Optional

import torch
from torch.optim import Optimizer

from habana_frameworks.torch.core import step_closure
from habana_frameworks.torch.hpex.optimizers._adamw_update import (
    MomentsDtype,
    adamw_,
    in_fp8,
    init_state,
    moment_dtypes,
)


class FusedAdamW(Optimizer):
    """Gaudi's fused AdamW: each step equals ``torch.optim.AdamW`` with the same ``lr``, ``betas``, ``eps`` and
    ``weight_decay`` (note the bridge's defaults: ``eps=1e-6``, ``weight_decay=0``). ``bias_correction=False`` leaves
    the moments uncorrected; ``moments_dtype`` keeps both moments (or ``(first, second)``) in another dtype, fp8 ones
    with a scale per tensor. The step count is kept per group (``group["step"]``), as on Gaudi."""

    def __init__(
        self,
        params: Iterable[torch.nn.parameter.Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        bias_correction: bool = True,
        moments_dtype: MomentsDtype = None,
    ) -> None:
        _check_adam_arguments(lr, betas, eps)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction)
        super().__init__(params, defaults)
        self.moments_dtype = moments_dtype
        self.moments_in_fp8 = in_fp8(moments_dtype)

    @torch.no_grad()
    def step(self, closure: Optional[Callable] = None) -> Optional[torch.Tensor]:
        """Performs a single optimization step; ``closure`` re-evaluates the model and returns the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            step_closure._mark_step_if_lazy()
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            group["step"] = group.get("step", 0) + 1
            beta1, beta2 = group["betas"]
            for param in params:
                if param.grad.is_sparse:
                    raise RuntimeError("FusedAdamW does not support sparse gradients; use torch.optim.SparseAdam.")
                state = self.state[param]
                if not state:
                    init_state(state, param, self.moments_dtype)
                adamw_(
                    param,
                    param.grad,
                    state,
                    step=group["step"],
                    lr=group["lr"],
                    beta1=beta1,
                    beta2=beta2,
                    eps=group["eps"],
                    weight_decay=group["weight_decay"],
                    bias_correction=self.is_bias_correction(group),
                )
        step_closure._mark_step_if_lazy()
        return loss

    def is_bias_correction(self, group: dict) -> bool:
        """Whether ``group`` corrects the moments' bias; groups loaded from older checkpoints spell it
        ``correct_bias``, and those of ``torch.optim.AdamW`` checkpoints do not say (and correct)."""
        if "bias_correction" in group:
            return group["bias_correction"]
        return group.get("correct_bias", True)

    def get_moment_dtypes(self, param_dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
        """The dtypes of the first and second moments of a parameter of ``param_dtype``."""
        return moment_dtypes(self.moments_dtype, param_dtype)

    def check_moments_in_fp8(self) -> bool:
        """Whether a moment is kept in fp8."""
        return in_fp8(self.moments_dtype)


def _check_adam_arguments(lr: float, betas: tuple[float, float], eps: float) -> None:
    if lr < 0.0:
        raise ValueError(f"Invalid learning rate: {lr} - should be >= 0.0")
    for index, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {index}: {beta} - should be in [0.0, 1.0[")
    if eps < 0.0:
        raise ValueError(f"Invalid epsilon value: {eps} - should be >= 0.0")
