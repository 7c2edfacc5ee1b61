"""fp8 attention of Gaudi 2 and 3: the names exist; calling them says that the virtual Gaudi does not model it."""

from typing import NoReturn

import torch

_WHY = (
    "fp8 fused attention (hpex.kernels.{}) is not modelled on the virtual Gaudi: its scaling of queries, keys,"
    " values and probabilities to fp8 is the hardware's. Use FusedSDPA in bf16, or run on a Gaudi."
)


def _not_modelled(name: str) -> NoReturn:
    raise NotImplementedError(_WHY.format(name))


def fp8_fused_sdpa(
    q,
    k,
    v,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    softmax_mode="None",
    d_scale_q=None,
    d_scale_k=None,
    d_scale_v=None,
    q_scale_s=None,
    q_scale_o=None,
    d_scale_s=None,
    is_amax_s=False,
    is_amax_o=False,
    valid_seq_len=None,
    seq_padding_type="left",
    recompute=None,
):
    _not_modelled("fp8_fused_sdpa")


def fp8_sdpa_fwd_wrapper(
    ctx,
    q,
    k,
    v,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    softmax_mode="None",
    d_scale_q=None,
    d_scale_k=None,
    d_scale_v=None,
    q_scale_s=None,
    q_scale_o=None,
    d_scale_s=None,
    is_amax_s=False,
    is_amax_o=False,
    valid_seq_len=None,
    seq_padding_type="left",
    recompute=None,
):
    _not_modelled("fp8_sdpa_fwd_wrapper")


def fp8_sdpa_bwd_wrapper(ctx, dout, *args):
    _not_modelled("fp8_sdpa_bwd_wrapper")


def gqa_output_reshape(tensor: torch.Tensor) -> torch.Tensor:
    """``[batch, groups, heads per group, seq, dim]`` to ``[batch, heads, seq, dim]``."""
    batch, groups, per_group, length, dim = tensor.shape
    return tensor.reshape(batch, groups * per_group, length, dim)
