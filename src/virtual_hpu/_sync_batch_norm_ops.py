"""aten's batch-norm statistics ops, which ``torch.nn.SyncBatchNorm`` calls on an accelerator ("hpu" among them).

torch has kernels for them on GPUs only, none on the CPU, so the device's fallback to CPU kernels cannot run them; Gaudi
has its own. Registered for the device when the facade is imported. Statistics of reduced-precision inputs are kept
in float32, as accelerators accumulate them.
"""

from typing import Optional

import torch
from torch import Tensor

_library = torch.library.Library("aten", "IMPL")


def _statistics_dtype(tensor: Tensor) -> torch.dtype:
    return torch.float32 if tensor.dtype in (torch.float16, torch.bfloat16) else tensor.dtype


def _per_channel(values: Tensor, like: Tensor) -> Tensor:
    """A per-channel vector shaped to broadcast over ``like`` (channels in dimension 1)."""
    return values.reshape(1, -1, *([1] * (like.dim() - 2)))


def _reduced_dims(tensor: Tensor) -> list[int]:
    return [dim for dim in range(tensor.dim()) if dim != 1]


def _batch_norm_stats(input: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    values = input.to(_statistics_dtype(input))
    variance, mean = torch.var_mean(values, dim=_reduced_dims(values), correction=0)
    return mean, torch.rsqrt(variance + eps)


def _batch_norm_gather_stats_with_counts(
    input: Tensor,
    mean: Tensor,
    invstd: Tensor,
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    momentum: float,
    eps: float,
    counts: Tensor,
) -> tuple[Tensor, Tensor]:
    # each row of mean and invstd is one process's statistics over its counts[i] values
    counts = counts.to(mean.dtype).unsqueeze(1)
    total = counts.sum(0)
    global_mean = (counts * mean).sum(0) / total
    local_variance = invstd.pow(-2) - eps
    variance = (counts * (local_variance + (mean - global_mean).pow(2))).sum(0) / total
    with torch.no_grad():
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(global_mean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = variance * total / (total - 1)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
    return global_mean, torch.rsqrt(variance + eps)


def _batch_norm_elemt(
    input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], mean: Tensor, invstd: Tensor, eps: float
) -> Tensor:
    output = (input.to(mean.dtype) - _per_channel(mean, input)) * _per_channel(invstd, input)
    if weight is not None:
        output = output * _per_channel(weight, input)
    if bias is not None:
        output = output + _per_channel(bias, input)
    return output.to(input.dtype)


def _batch_norm_backward_reduce(
    grad_out: Tensor,
    input: Tensor,
    mean: Tensor,
    invstd: Tensor,
    weight: Optional[Tensor],
    input_g: bool,
    weight_g: bool,
    bias_g: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    dims = _reduced_dims(input)
    grad = grad_out.to(mean.dtype)
    sum_dy = grad.sum(dims)
    sum_dy_xmu = (grad * (input.to(mean.dtype) - _per_channel(mean, input))).sum(dims)
    parameter_dtype = weight.dtype if weight is not None else mean.dtype
    grad_weight = (sum_dy_xmu * invstd).to(parameter_dtype)
    return sum_dy, sum_dy_xmu, grad_weight, sum_dy.to(parameter_dtype)


def _batch_norm_backward_elemt(
    grad_out: Tensor,
    input: Tensor,
    mean: Tensor,
    invstd: Tensor,
    weight: Optional[Tensor],
    sum_dy: Tensor,
    sum_dy_xmu: Tensor,
    count: Tensor,
) -> Tensor:
    # sum_dy and sum_dy_xmu are summed over all processes, whose value counts are ``count``
    total = count.to(mean.dtype).sum()
    scale = invstd if weight is None else invstd * weight.to(mean.dtype)
    centred = input.to(mean.dtype) - _per_channel(mean, input)
    grad = (
        grad_out.to(mean.dtype)
        - _per_channel(sum_dy / total, input)
        - centred * _per_channel(invstd.pow(2) * sum_dy_xmu / total, input)
    ) * _per_channel(scale, input)
    return grad.to(input.dtype)


def register(dispatch_key: str) -> None:
    """Register the kernels for the device's dispatch key ("HPU", or "PrivateUse1" where the device is torch's
    PrivateUse1 backend)."""
    kernels = {
        "batch_norm_stats": _batch_norm_stats,
        "batch_norm_gather_stats_with_counts": _batch_norm_gather_stats_with_counts,
        "batch_norm_elemt": _batch_norm_elemt,
        "batch_norm_backward_reduce": _batch_norm_backward_reduce,
        "batch_norm_backward_elemt": _batch_norm_backward_elemt,
    }
    for name, kernel in kernels.items():
        _library.impl(name, kernel, dispatch_key)
