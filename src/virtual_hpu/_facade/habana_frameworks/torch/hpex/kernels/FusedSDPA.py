"""``FusedSDPA``: Gaudi's fused scaled dot-product attention, with the arguments of the bridge's ``apply``.

The virtual Gaudi computes the attention of :func:`torch.nn.functional.scaled_dot_product_attention` in float32 and
returns the inputs' dtype. ``softmax_mode="fast"`` (an approximate softmax on a Gaudi) and ``recompute_mode`` (keep
less for the backward and recompute it) change speed and memory on a Gaudi; here both compute the exact softmax.
The bridge's restrictions are kept, so a call that runs here runs on a Gaudi.
"""

import math
from typing import Optional, Union

import torch

_PADDING_SIDES = ("left", "right")


def _repeat_heads(t: torch.Tensor, groups: int) -> torch.Tensor:
    """Key/value heads repeated for each query head of their group (grouped-query attention)."""
    return t if groups == 1 else t.repeat_interleave(groups, dim=-3)


def _sum_heads(grad: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return grad
    *batch, heads, length, dim = grad.shape
    return grad.reshape(*batch, heads // groups, groups, length, dim).sum(-3)


def _valid_tokens(
    lengths: torch.Tensor, q_len: int, kv_len: int, padding_side: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which key columns and which query rows are tokens, not padding, for each sequence of the batch.

    ``lengths[b]`` tokens of sequence ``b`` are at the end of it (``"left"`` padding) or at its start (``"right"``).
    """
    lengths = lengths.reshape(-1, 1).to(torch.long)
    keys = torch.arange(kv_len, device=lengths.device)
    queries = torch.arange(q_len, device=lengths.device)
    if padding_side == "left":
        return keys >= kv_len - lengths, queries >= q_len - lengths
    return keys < lengths, queries < lengths


def attention_probabilities(
    q: torch.Tensor,
    k: torch.Tensor,
    attn_mask: Optional[torch.Tensor],
    is_causal: bool,
    scale: float,
    valid_seq_len: Optional[torch.Tensor] = None,
    padding_side: str = "left",
) -> torch.Tensor:
    """``softmax(q @ k^T * scale + mask)`` in float32; rows that may attend to no key are zero, as in torch."""
    scores = torch.matmul(q.float(), k.float().transpose(-2, -1)) * scale
    q_len, kv_len = scores.shape[-2:]
    allowed = None
    if is_causal:
        allowed = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        allowed = attn_mask if allowed is None else allowed & attn_mask
    elif attn_mask is not None:
        scores = scores + attn_mask.float()
    rows = None
    if valid_seq_len is not None:
        keys, rows = _valid_tokens(valid_seq_len, q_len, kv_len, padding_side)
        keys = keys.view(-1, *([1] * (scores.dim() - 2)), kv_len)
        allowed = keys if allowed is None else allowed & keys
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    any_key = scores.amax(dim=-1, keepdim=True) > float("-inf")
    if rows is not None:  # padding queries attend to nothing: their output is zero
        any_key = any_key & rows.view(-1, *([1] * (scores.dim() - 3)), q_len, 1)
    return torch.where(any_key, probs, 0.0)


def _check(
    q: torch.Tensor,
    k: torch.Tensor,
    attn_mask: Optional[torch.Tensor],
    is_causal: bool,
    softmax_mode: str,
    recompute: bool,
    valid_seq_len: Optional[torch.Tensor],
    padding_side: str,
    needs_grad: bool,
    return_dropout_mask: bool,
    return_attn_probs: bool,
) -> None:
    if softmax_mode not in ("none", "fast"):
        raise ValueError(f"FusedSDPA: softmax_mode={softmax_mode!r} is not one of 'None', 'fast'.")
    if padding_side not in _PADDING_SIDES:
        raise ValueError(f"FusedSDPA: seq_padding_type={padding_side!r} is not one of {_PADDING_SIDES}.")
    if q.shape[-3] % k.shape[-3]:
        raise ValueError(
            f"FusedSDPA: {q.shape[-3]} query heads cannot be grouped over {k.shape[-3]} key/value heads;"
            " the query heads must be a multiple of the key/value heads."
        )
    if return_attn_probs and needs_grad:
        raise ValueError("FusedSDPA: return_attn_probs=True is for inference only; call it under torch.no_grad().")
    if recompute and needs_grad and softmax_mode == "fast" and not is_causal:
        raise ValueError(
            "FusedSDPA: softmax_mode='fast' trains in recompute mode only with is_causal=True;"
            " pass is_causal=True, softmax_mode='None' or recompute_mode=False."
        )
    if valid_seq_len is not None and (not is_causal or needs_grad or attn_mask is not None):
        raise ValueError(
            "FusedSDPA: valid_seq_len is for inference with is_causal=True and no attn_mask; call it under"
            " torch.no_grad() with is_causal=True, or pass the padding as attn_mask instead."
        )
    if recompute and return_dropout_mask and not return_attn_probs:
        raise ValueError("FusedSDPA: return_dropout_mask=True needs recompute_mode=False.")


class FusedSDPA(torch.autograd.Function):
    """Scaled dot-product attention; ``FusedSDPA.apply(q, k, v, attn_mask, dropout_p, is_causal, scale, ...)``.

    ``valid_seq_len`` (a tensor of one length per sequence, inference with ``is_causal`` only) says how many tokens
    of each sequence are real, the rest being padding on ``seq_padding_type``'s side ("left": before the tokens):
    no query attends to padding, and the outputs of padding queries are zero.
    """

    @staticmethod
    def forward(
        ctx,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: Optional[float] = None,
        softmax_mode: str = "None",
        recompute_mode: Optional[bool] = None,
        valid_seq_len: Optional[torch.Tensor] = None,
        seq_padding_type: str = "left",
        return_dropout_mask: bool = False,
        return_attn_probs: bool = False,
    ) -> Union[torch.Tensor, tuple[torch.Tensor, ...]]:
        import habana_frameworks.torch.hpu as hpu

        softmax_mode = str(softmax_mode).lower()
        padding_side = seq_padding_type.lower()
        needs_grad = q.requires_grad or k.requires_grad or v.requires_grad
        recompute = hpu.recompute_sdp_enabled() if recompute_mode is None else bool(recompute_mode)
        if return_attn_probs:
            recompute = False
        _check(
            q, k, attn_mask, is_causal, softmax_mode, recompute, valid_seq_len, padding_side, needs_grad,
            return_dropout_mask, return_attn_probs,
        )  # fmt: skip
        scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
        groups = q.shape[-3] // k.shape[-3]
        k_full, v_full = _repeat_heads(k, groups), _repeat_heads(v, groups)
        probs = attention_probabilities(q, k_full, attn_mask, is_causal, scale, valid_seq_len, padding_side)
        keep = None
        if dropout_p > 0.0:
            # the draws of torch's dropout of the probabilities, so a seeded run matches scaled_dot_product_attention
            keep = torch.nn.functional.dropout(torch.ones_like(probs), dropout_p)
        dropped = probs if keep is None else probs * keep
        out = torch.matmul(dropped, v_full.float()).to(q.dtype)
        ctx.save_for_backward(q, k_full, v_full, probs, keep)
        ctx.scale, ctx.groups = scale, groups
        ctx.set_materialize_grads(True)
        extra = []
        if return_attn_probs:
            extra.append(probs.to(q.dtype))
        if return_dropout_mask:
            extra.append(torch.ones_like(probs, dtype=torch.bool) if keep is None else keep != 0)
        if extra:
            ctx.mark_non_differentiable(*extra)
        return (out, *extra) if extra else out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor, *unused: torch.Tensor):
        q, k_full, v_full, probs, keep = ctx.saved_tensors
        grad_out = grad_out.float()
        dropped = probs if keep is None else probs * keep
        grad_v = torch.matmul(dropped.transpose(-2, -1), grad_out)
        grad_dropped = torch.matmul(grad_out, v_full.float().transpose(-2, -1))
        grad_probs = grad_dropped if keep is None else grad_dropped * keep
        grad_scores = probs * (grad_probs - (grad_probs * probs).sum(-1, keepdim=True)) * ctx.scale
        grad_q = torch.matmul(grad_scores, k_full.float())
        grad_k = torch.matmul(grad_scores.transpose(-2, -1), q.float())
        groups = ctx.groups
        grad_k = _sum_heads(grad_k, groups).to(k_full.dtype)
        grad_v = _sum_heads(grad_v, groups).to(v_full.dtype)
        return (grad_q.to(q.dtype), grad_k, grad_v) + (None,) * 10
