"""RMSNorm (Zhang and Sennrich, "Root Mean Square Layer Normalization") over the last dimension, as one autograd op."""

from enum import Enum

import torch

from virtual_hpu import torch_support


class RmsNormBwdMode(Enum):
    """How Gaudi's graph compiler partitions the backward kernel; the result is the same in every mode."""

    DEFAULT = 0
    STATIC_CASE_WIDTH_PARTITIONING = 1


class FusedRMSNorm(torch.autograd.Function):
    """``FusedRMSNorm.apply(x, gamma, eps, use_stages=True, bwd_mode=0, fast_math=False)`` is
    ``x / sqrt(mean(x², -1) + eps) * gamma``, computed in fp32 and returned in ``x``'s dtype, with its gradients for
    ``x`` and ``gamma``. ``use_stages``, ``bwd_mode`` and ``fast_math`` choose among Gaudi's kernels, which compute
    the same function; the virtual Gaudi has one."""

    @staticmethod
    def forward(ctx, data_in, gamma, eps, use_stages=True, bwd_mode=0, fast_math=False):
        x = data_in.float()
        inverse_rms = torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(inverse_rms, data_in, gamma)
        return torch_support.function_result(x * inverse_rms * gamma.float(), data_in.dtype)

    @staticmethod
    def backward(ctx, root_mean_square_norm_grad_in):
        inverse_rms, data_in, gamma = ctx.saved_tensors
        x, grad = data_in.float(), root_mean_square_norm_grad_in.float()
        normalized = x * inverse_rms
        grad_normalized = grad * gamma.float()
        # d(x r)/dx with r = (mean(x²) + eps)^-1/2: r (g - x̂ mean(g x̂)) for the upstream gradient g
        grad_in = inverse_rms * (grad_normalized - normalized * (grad_normalized * normalized).mean(-1, keepdim=True))
        grad_gamma = (grad * normalized).reshape(-1, gamma.numel()).sum(0).reshape(gamma.shape)
        return grad_in.to(data_in.dtype), grad_gamma.to(gamma.dtype), None, None, None, None
