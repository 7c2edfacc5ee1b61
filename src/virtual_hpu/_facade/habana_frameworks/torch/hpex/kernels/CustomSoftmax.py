"""``CustomSoftmax``: Gaudi's softmax over the last dimension for bfloat16, with a choice of exponent."""

import torch


class CustomSoftmax(torch.autograd.Function):
    """``CustomSoftmax.apply(input, flavor)``: softmax over the last dimension of a bfloat16 tensor.

    ``flavor`` 0 uses the exact exponent, 1 a faster approximate one on a Gaudi; the virtual Gaudi computes both
    exactly. The kernel is bfloat16 only, so other dtypes are refused here as well.
    """

    @staticmethod
    def forward(ctx, inp: torch.Tensor, flavor: int) -> torch.Tensor:
        if inp.dtype != torch.bfloat16:
            raise TypeError(f"CustomSoftmax computes in bfloat16 only, got {inp.dtype}; pass input.to(torch.bfloat16).")
        if flavor not in (0, 1):
            raise ValueError(f"CustomSoftmax: flavor={flavor!r} is not 0 (exact exponent) or 1 (approximate).")
        result = torch.softmax(inp, dim=-1)
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (result,) = ctx.saved_tensors
        return torch._softmax_backward_data(grad, result, result.dim() - 1, result.dtype), None
