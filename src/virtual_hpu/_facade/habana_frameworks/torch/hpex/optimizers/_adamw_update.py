"""The AdamW update the fused AdamW optimizers share, with moments kept in a dtype of the user's choice."""

import math
from typing import Optional, Union

import torch

MomentsDtype = Optional[Union[torch.dtype, tuple[torch.dtype, torch.dtype]]]
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def moment_dtypes(moments_dtype: MomentsDtype, param_dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
    """The dtypes of the first and second moments: the parameter's unless ``moments_dtype`` names one or two."""
    if moments_dtype is None:
        return param_dtype, param_dtype
    if isinstance(moments_dtype, tuple):
        return moments_dtype
    return moments_dtype, moments_dtype


def in_fp8(moments_dtype: MomentsDtype) -> bool:
    dtypes = moments_dtype if isinstance(moments_dtype, tuple) else (moments_dtype,)
    return any(dtype in _FP8 for dtype in dtypes)


def init_state(state: dict, param: torch.Tensor, moments_dtype: MomentsDtype) -> None:
    """The bridge's state layout, so checkpoints move between a Gaudi and the virtual one: ``step`` stays 0 (the step
    count lives in the parameter group), and fp8 moments carry a scale each."""
    first, second = moment_dtypes(moments_dtype, param.dtype)
    state["step"] = 0
    state["exp_avg"] = torch.zeros(param.shape, dtype=first, device=param.device)
    state["exp_avg_sq"] = torch.zeros(param.shape, dtype=second, device=param.device)
    if in_fp8(moments_dtype):
        state["exp_avg_scale"] = torch.ones(1, dtype=param.dtype, device=param.device)
        state["exp_avg_sq_scale"] = torch.ones(1, dtype=param.dtype, device=param.device)


def adamw_(
    param: torch.Tensor,
    grad: torch.Tensor,
    state: dict,
    *,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    bias_correction: bool,
    eps_on_uncorrected: bool = False,
) -> None:
    """One AdamW step of ``param`` in place, in the order and form of ``torch.optim.AdamW``; with
    ``eps_on_uncorrected``, in the form of Gaudi's ``optimizer_adamw`` kernel: ``eps`` added to the root of the
    uncorrected second moment, both bias corrections folded into the step size."""
    if weight_decay != 0:
        param.mul_(1 - lr * weight_decay)
    exp_avg = _load(state, "exp_avg")
    exp_avg_sq = _load(state, "exp_avg_sq")
    exp_avg.lerp_(grad.to(exp_avg.dtype), 1 - beta1)
    grad = grad.to(exp_avg_sq.dtype)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**step if bias_correction else 1.0
    bias_correction2 = 1 - beta2**step if bias_correction else 1.0
    if eps_on_uncorrected:
        denom = exp_avg_sq.sqrt().add_(eps)
        step_size = lr * math.sqrt(bias_correction2) / bias_correction1
    else:
        denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(eps)
        step_size = lr / bias_correction1
    if exp_avg.dtype == denom.dtype == param.dtype:
        param.addcdiv_(exp_avg, denom, value=-step_size)
    else:
        param.add_((exp_avg.float() / denom.float()).to(param.dtype), alpha=-step_size)
    _store(state, "exp_avg", exp_avg)
    _store(state, "exp_avg_sq", exp_avg_sq)


def _load(state: dict, name: str) -> torch.Tensor:
    """The moment to update in place: itself, or for fp8 moments its fp32 value (stored value times scale)."""
    moment = state[name]
    if moment.dtype not in _FP8:
        return moment
    return moment.float() * state[f"{name}_scale"].float()


def _store(state: dict, name: str, value: torch.Tensor) -> None:
    """Put an fp8 moment back with a per-tensor scale that maps its largest magnitude to the format's largest."""
    moment = state[name]
    if moment.dtype not in _FP8:
        return
    amax = value.abs().max()
    scale = torch.where(amax > 0, amax / torch.finfo(moment.dtype).max, torch.ones_like(amax))
    moment.copy_((value / scale).to(moment.dtype))
    state[f"{name}_scale"].copy_(scale.reshape(1))
