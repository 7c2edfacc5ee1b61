"""Rotary position embeddings (RoPE) as Gaudi's fused kernel computes them, for the layouts of the models named.

``BLOCKWISE`` rotates the two halves of the last dimension (GPT-NeoX, LLaMA: ``rotate_half``), ``PAIRWISE`` each
pair of neighbours (GPT-J: ``rotate_every_two``). The embedding is ``p * cos + rotate(p) * sin``; its gradient with
respect to ``p`` is ``g * cos - rotate(g * sin)``, as the rotation is antisymmetric. ``cos`` and ``sin`` get none.
"""

from enum import Enum
from typing import Optional

import torch


class RotaryPosEmbeddingMode(Enum):
    BLOCKWISE = 0
    PAIRWISE = 1


def _rotate(x: torch.Tensor, mode: RotaryPosEmbeddingMode) -> torch.Tensor:
    if mode == RotaryPosEmbeddingMode.BLOCKWISE:
        first, second = x.chunk(2, dim=-1)
        return torch.cat((-second, first), dim=-1)
    even, odd = x[..., ::2], x[..., 1::2]
    return torch.stack((-odd, even), dim=-1).flatten(-2)


def _common_dtype(p: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """float32 if any of them is float32, otherwise the dtype of ``p``, as the fused kernel takes them."""
    dtype = torch.float32 if torch.float32 in (p.dtype, cos.dtype, sin.dtype) else p.dtype
    return p.to(dtype), cos.to(dtype), sin.to(dtype)


def _positions(
    table: torch.Tensor, length: int, position_ids: Optional[torch.Tensor], offset: int, mode: RotaryPosEmbeddingMode
) -> torch.Tensor:
    """The rows of a cos/sin table (sequence on dim -2) for the tokens: by ``position_ids``, else from ``offset``."""
    if mode != RotaryPosEmbeddingMode.BLOCKWISE:
        return table
    if position_ids is not None:
        # a [..., max_positions, dim] table with leading ones; a [batch, 1, seq, dim] result
        return table.reshape(table.shape[-2], table.shape[-1])[position_ids].unsqueeze(1)
    if table.shape[-2] == length and offset == 0:
        return table
    return table[..., offset : offset + length, :]


def _embed(p, cos, sin, position_ids, offset, mode, backward: bool = False) -> torch.Tensor:
    p, cos, sin = _common_dtype(p, cos, sin)
    cos = _positions(cos, p.shape[-2], position_ids, offset, mode)
    sin = _positions(sin, p.shape[-2], position_ids, offset, mode)
    if backward:
        return p * cos - _rotate(p * sin, mode)
    return p * cos + _rotate(p, mode) * sin


def apply_rotary_pos_emb(p: torch.Tensor, *args) -> torch.Tensor:
    """``apply_rotary_pos_emb(p, cos, sin, position_ids=None, offset=0, mode=BLOCKWISE)``, or
    ``apply_rotary_pos_emb(p, rope_cache)`` for ChatGLM's combined cache (see :class:`RotaryPosEmbeddingHelperV3`)."""
    if len(args) == 1:
        return RotaryPosEmbeddingHelperV3.apply(p, args[0])
    cos, sin = args[0], args[1]
    position_ids = args[2] if len(args) > 2 else None
    offset = args[3] if len(args) > 3 else 0
    mode = args[4] if len(args) > 4 else RotaryPosEmbeddingMode.BLOCKWISE
    return _embed(p, cos, sin, position_ids, offset, mode)


class RotaryPosEmbeddingHelperV1(torch.autograd.Function):
    """RoPE of Transformers' GPT-NeoX up to 4.27.4 (LLaMA): ``apply(p, cos, sin, offset)``, blockwise."""

    @staticmethod
    def forward(ctx, p, cos, sin, offset):
        ctx.save_for_backward(cos, sin)
        ctx.offset, ctx.dtype = offset, p.dtype
        return _embed(p, cos, sin, None, offset, RotaryPosEmbeddingMode.BLOCKWISE)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        grad_p = _embed(grad, cos, sin, None, ctx.offset, RotaryPosEmbeddingMode.BLOCKWISE, backward=True)
        return grad_p.to(ctx.dtype), None, None, None


class RotaryPosEmbeddingHelperV2(torch.autograd.Function):
    """RoPE of Transformers after 4.27.4 (StableLM): ``apply(p, cos, sin, position_ids)``, blockwise."""

    @staticmethod
    def forward(ctx, p, cos, sin, position_ids):
        ctx.save_for_backward(cos, sin, position_ids)
        ctx.dtype = p.dtype
        return _embed(p, cos, sin, position_ids, 0, RotaryPosEmbeddingMode.BLOCKWISE)

    @staticmethod
    def backward(ctx, grad):
        cos, sin, position_ids = ctx.saved_tensors
        grad_p = _embed(grad, cos, sin, position_ids, 0, RotaryPosEmbeddingMode.BLOCKWISE, backward=True)
        return grad_p.to(ctx.dtype), None, None, None


def _split_rope_cache(p: torch.Tensor, rope_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """ChatGLM's ``rope_cache[seq, ..., rot_dim / 2, 2]`` (cos, sin pairs) as pairwise cos and sin tables for the
    rotated part ``p[..., :rot_dim]`` of ``p[seq, batch, heads, dim]``."""
    seq = p.size(0)
    rot_dim = rope_cache.shape[-2] * 2
    cache = rope_cache[:seq].reshape(seq, -1, 1, rot_dim // 2, 2)
    cos = cache[..., 0].repeat_interleave(2, dim=-1).to(p.dtype)
    sin = cache[..., 1].repeat_interleave(2, dim=-1).to(p.dtype)
    return cos, sin, rot_dim


class RotaryPosEmbeddingHelperV3(torch.autograd.Function):
    """RoPE of ChatGLM: ``apply(p, rope_cache)``, pairwise on the first ``rope_cache.shape[-2] * 2`` channels."""

    @staticmethod
    def forward(ctx, p, rope_cache):
        ctx.save_for_backward(rope_cache)
        cos, sin, rot_dim = _split_rope_cache(p, rope_cache)
        rotated = _embed(p[..., :rot_dim], cos, sin, None, 0, RotaryPosEmbeddingMode.PAIRWISE).to(p.dtype)
        return torch.cat((rotated, p[..., rot_dim:]), dim=-1)

    @staticmethod
    def backward(ctx, grad):
        (rope_cache,) = ctx.saved_tensors
        cos, sin, rot_dim = _split_rope_cache(grad, rope_cache)
        rotated = _embed(grad[..., :rot_dim], cos, sin, None, 0, RotaryPosEmbeddingMode.PAIRWISE, backward=True)
        return torch.cat((rotated.to(grad.dtype), grad[..., rot_dim:]), dim=-1), None
