"""AdamW (decoupled weight decay) in Gaudi's form, with optional bias correction and moment dtypes."""

import math
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
from habana_frameworks.torch.utils.internal import is_lazy


class FusedAdamW(Optimizer):
    """Gaudi's fused AdamW: one ``torch.ops.hpu.optimizer_adamw`` per parameter group updates all its parameters.

    A step is ``torch.optim.AdamW``'s with the same ``lr``, ``betas``, ``eps`` and ``weight_decay`` (note the bridge's
    defaults: ``eps=1e-6``, ``weight_decay=0``) except where ``eps`` enters, as in Gaudi's kernel: it is added to the
    root of the uncorrected second moment, and both bias corrections scale the step
    (``-lr * sqrt(1 - beta2**t) / (1 - beta1**t)``), as in DeepSpeed's FusedAdam. ``bias_correction=False`` leaves the
    moments uncorrected; ``moments_dtype`` keeps both moments (or ``(first, second)``) in another dtype, fp8 ones with
    a scale per tensor (the virtual Gaudi updates those parameter by parameter). The step count is kept per group
    (``group["step"]``), as on Gaudi."""

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
                if not self.state[param]:
                    init_state(self.state[param], param, self.moments_dtype)
            if self.moments_dtype is None:
                self._fused_step(group, params)
                continue
            for param in params:
                state = self.state[param]
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
                    eps_on_uncorrected=True,
                )
        step_closure._mark_step_if_lazy()
        return loss

    def _fused_step(self, group: dict, params: list) -> None:
        """The group's update in one op, called as the bridge calls it: step size and weight decay come folded, as
        one-element device tensors in eager mode, the weight decay as a float in lazy mode."""
        beta1, beta2 = group["betas"]
        step_size = group["lr"]
        if self.is_bias_correction(group):
            step_size *= math.sqrt(1 - beta2 ** group["step"]) / (1 - beta1 ** group["step"])
        dtype, device = params[0].dtype, params[0].device
        neg_step = torch.tensor([-step_size], dtype=dtype, device=device)
        decay = 1.0 - group["weight_decay"] * group["lr"]
        lists = (
            [p.grad for p in params],
            params,
            [self.state[p]["exp_avg"] for p in params],
            [self.state[p]["exp_avg_sq"] for p in params],
        )
        arguments = (*lists, neg_step, beta1, beta2, group["eps"])
        if is_lazy():
            torch.ops.hpu.optimizer_adamw(*arguments, decay)
        else:
            decay_t = torch.tensor([decay], dtype=dtype, device=device)
            torch.ops.hpu.optimizer_adamw(*arguments, decay_t, decay != 1.0)

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
