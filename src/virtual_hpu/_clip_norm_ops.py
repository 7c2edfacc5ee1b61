"""The bridge's fused gradient clipping ops, which ``hpex.normalization.FusedClipNorm`` calls:
``torch.ops.hpu.fused_clip_norm`` in eager mode and ``torch.ops.hpu.fused_norm_lazy`` in lazy mode.

Both take every gradient in one call and so reach the device as one op, where ``torch.nn.utils.clip_grad_norm_``
launches a norm and a multiplication per gradient. Their arithmetic is torch's (per-gradient L2 norms, the L2 norm of
those, ``max_norm / (total + 1e-6)`` clamped to 1), in the first gradient's dtype, with the norm type 2 only, as
Gaudi's kernels. The eager op writes the total norm into the last tensor of its list (a one-element placeholder the
caller appends) and returns it; the lazy op leaves the gradients unscaled where the total is not above ``max_norm``,
a NaN total included.

Only a CPU kernel is registered: hpu tensors reach it through the virtual Gaudi's fallback, which counts one op.
"""

import torch

_library = torch.library.Library("hpu", "FRAGMENT")
_library.define("fused_clip_norm(Tensor(a!)[] grad, Tensor max_norm, float norm_type) -> Tensor")
_library.define("fused_norm_lazy(Tensor(a!)[] grad, Tensor max_norm, float norm_type) -> Tensor")

_EPS = 1e-6  # torch's and Gaudi's, so that a zero norm divides


def _total_norm(gradients: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    if not gradients:
        raise RuntimeError("fused clip norm needs at least one gradient")
    if norm_type != 2.0:
        raise RuntimeError(f"unsupported norm_type {norm_type} for FusedClipNorm: Gaudi's kernel supports 2.0 only")
    dtype = gradients[0].dtype
    norms = [torch.linalg.vector_norm(g.to(dtype)) for g in gradients]
    return torch.linalg.vector_norm(torch.stack(norms))


@torch.no_grad()
def _fused_clip_norm(grad: list[torch.Tensor], max_norm: torch.Tensor, norm_type: float) -> torch.Tensor:
    *gradients, total_out = grad
    total = _total_norm(gradients, norm_type)
    coefficient = torch.clamp(max_norm.to(total.dtype) / (total + _EPS), max=1.0)
    for g in gradients:
        g.mul_(coefficient.to(g.dtype))
    return total_out.copy_(total.reshape(total_out.shape))


@torch.no_grad()
def _fused_norm_lazy(grad: list[torch.Tensor], max_norm: torch.Tensor, norm_type: float) -> torch.Tensor:
    total = _total_norm(grad, norm_type)
    limit = max_norm.to(total.dtype)
    coefficient = torch.where(total > limit, limit / (total + _EPS), torch.ones_like(limit))
    for g in grad:
        g.mul_(coefficient.to(g.dtype))
    return total.reshape(1)


def _fused_clip_norm_fake(grad: list[torch.Tensor], max_norm: torch.Tensor, norm_type: float) -> torch.Tensor:
    return torch.empty_like(grad[-1])


def _fused_norm_lazy_fake(grad: list[torch.Tensor], max_norm: torch.Tensor, norm_type: float) -> torch.Tensor:
    return grad[0].new_empty((1,))


for _name, _kernel, _fake in (
    ("fused_clip_norm", _fused_clip_norm, _fused_clip_norm_fake),
    ("fused_norm_lazy", _fused_norm_lazy, _fused_norm_lazy_fake),
):
    _library.impl(_name, _kernel, "CPU")
    torch.library.register_fake(f"hpu::{_name}", _fake, lib=_library)
