"""``habana_frameworks.torch.hpex.kernels`` on the virtual Gaudi: each kernel gives what its CPU reference gives,
forward and backward, in fp32 and bf16, eagerly, in lazy mode and compiled with ``hpu_backend``."""

import pytest
import torch
import torch.nn.functional as F
from habana_frameworks.torch.hpex.kernels import (
    CTCLoss,
    CustomSoftmax,
    FusedSDPA,
    PySDPA,
    RotaryPosEmbeddingHelperV1,
    RotaryPosEmbeddingHelperV2,
    RotaryPosEmbeddingHelperV3,
    RotaryPosEmbeddingMode,
    apply_rotary_pos_emb,
    fp8_fused_sdpa,
)

from virtual_hpu import torch_support

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TOLERANCE = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}


def _randn(*shape, dtype, seed=0, grad=True):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return t.requires_grad_(grad)


def _forward_backward(fn, inputs, device, compiled=False):
    """Output and input gradients of ``fn`` on copies of ``inputs`` moved to ``device``, with a weighted loss."""
    moved = [
        t.detach().to(device).requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t for t in inputs
    ]
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn, backend="hpu_backend")
    out = fn(*moved)
    weights = torch.linspace(-1, 1, out.numel()).view(out.shape).to(device)
    (out.float() * weights).sum().backward()
    import habana_frameworks.torch.core as htcore

    htcore.mark_step()
    grads = [t.grad.cpu() for t in moved if isinstance(t, torch.Tensor) and t.requires_grad]
    return out.detach().cpu(), grads


def _assert_matches(actual, expected, dtype, what):
    out, grads = actual
    ref_out, ref_grads = expected
    assert out.dtype == ref_out.dtype, f"{what}: output {out.dtype}, reference {ref_out.dtype}"
    torch.testing.assert_close(out.float(), ref_out.float(), **TOLERANCE[dtype], msg=lambda m: f"{what}, forward: {m}")
    assert len(grads) == len(ref_grads)
    for i, (grad, ref) in enumerate(zip(grads, ref_grads)):
        assert grad.dtype == ref.dtype, f"{what}: gradient {i} is {grad.dtype}, reference {ref.dtype}"
        torch.testing.assert_close(
            grad.float(), ref.float(), **TOLERANCE[dtype], msg=lambda m, i=i: f"{what}, grad {i}: {m}"
        )


# name -> (FusedSDPA.apply arguments after q, k, v; scaled_dot_product_attention keyword arguments); the masks are
# built from a seed, the dropout mask from the generator hpu shares with CPU
def _sdpa_cases(dtype):
    bool_mask = torch.rand(2, 1, 5, 5, generator=torch.Generator().manual_seed(3)) > 0.3
    float_mask = _randn(1, 4, 5, 5, dtype=dtype, seed=4, grad=False)
    return {
        "plain": ((), {}),
        "bool_mask": ((bool_mask,), {"attn_mask": bool_mask}),
        "float_mask": ((float_mask,), {"attn_mask": float_mask}),
        "causal": ((None, 0.0, True), {"is_causal": True}),
        "scale": ((None, 0.0, False, 0.5), {"scale": 0.5}),
        "dropout": ((None, 0.25), {"dropout_p": 0.25}),
        "fast_softmax_recompute_causal": ((None, 0.0, True, None, "fast", True), {"is_causal": True}),
        "gqa": ((), {"enable_gqa": True}),
    }


def _sdpa_inputs(case, dtype):
    kv_heads = 2 if case == "gqa" else 4
    return [_randn(2, 4, 5, 8, dtype=dtype, seed=0), _randn(2, kv_heads, 5, 8, dtype=dtype, seed=1),
            _randn(2, kv_heads, 5, 8, dtype=dtype, seed=2)]  # fmt: skip


def _check_sdpa(case, dtype, device="hpu", compiled=False):
    args, kwargs = _sdpa_cases(dtype)[case]

    def fused(q, k, v):
        torch.manual_seed(1)
        return FusedSDPA.apply(q, k, v, *[a.to(q.device) if isinstance(a, torch.Tensor) else a for a in args])

    def reference(q, k, v):
        torch.manual_seed(1)
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    inputs = _sdpa_inputs(case, dtype)
    expected = _forward_backward(reference, inputs, "cpu")
    _assert_matches(_forward_backward(fused, inputs, device, compiled), expected, dtype, f"FusedSDPA {case}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(_sdpa_cases(torch.float32)))
def test_fused_sdpa_equals_torchs_attention(case, dtype):
    _check_sdpa(case, DTYPES[dtype])


@pytest.mark.parametrize("hpu_mode", ["lazy"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_sdpa_in_lazy_mode(hpu_mode, dtype):
    for case in ("causal", "dropout", "gqa"):
        _check_sdpa(case, DTYPES[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_sdpa_compiled(dtype):
    for case in ("bool_mask", "causal", "dropout", "gqa"):
        _check_sdpa(case, DTYPES[dtype], compiled=True)


@pytest.mark.skipif(
    torch_support.installed() < torch_support.FUNCTION_APPLY_TAKES_KEYWORDS,
    reason="autograd.Function.apply takes keywords from torch 2.13 (before, the bridge's FusedSDPA takes none either)",
)
def test_fused_sdpa_takes_the_bridges_keywords():
    q, k, v = (_randn(1, 2, 3, 4, dtype=torch.float32, seed=s).to("hpu") for s in range(3))
    out = FusedSDPA.apply(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None, softmax_mode="None",
                          recompute_mode=None, valid_seq_len=None, seq_padding_type="left")  # fmt: skip
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q.cpu(), k.cpu(), v.cpu(), is_causal=True))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_valid_sequence_lengths_ignore_the_padding(padding_side, dtype):
    """Each sequence's tokens attend causally to the tokens only; a padding query's output is zero."""
    dtype = DTYPES[dtype]
    q, k, v = (_randn(2, 2, 6, 4, dtype=dtype, seed=s, grad=False) for s in range(3))
    lengths = torch.tensor([4, 6])
    with torch.no_grad():
        out = FusedSDPA.apply(q.to("hpu"), k.to("hpu"), v.to("hpu"), None, 0.0, True, None, "None", None,
                              lengths.to("hpu"), padding_side).cpu()  # fmt: skip
    for b, n in enumerate(lengths.tolist()):
        tokens = slice(6 - n, 6) if padding_side == "left" else slice(0, n)
        padding = slice(0, 6 - n) if padding_side == "left" else slice(n, 6)
        expected = F.scaled_dot_product_attention(q[b, :, tokens], k[b, :, tokens], v[b, :, tokens], is_causal=True)
        torch.testing.assert_close(out[b, :, tokens], expected, **TOLERANCE[dtype])
        assert out[b, :, padding].eq(0).all()


def test_fused_sdpa_refuses_what_the_bridge_refuses():
    q, k, v = (_randn(1, 2, 3, 4, dtype=torch.float32, seed=s).to("hpu") for s in range(3))
    with pytest.raises(ValueError, match="valid_seq_len is for inference"):
        FusedSDPA.apply(q, k, v, None, 0.0, True, None, "None", None, torch.tensor([2]).to("hpu"))
    with pytest.raises(ValueError, match="seq_padding_type='middle'"):
        FusedSDPA.apply(q, k, v, None, 0.0, False, None, "None", None, None, "middle")
    with pytest.raises(ValueError, match="softmax_mode='fast' trains in recompute mode only with is_causal"):
        FusedSDPA.apply(q, k, v, None, 0.0, False, None, "fast", True)
    with pytest.raises(ValueError, match="query heads must be a multiple"):
        FusedSDPA.apply(q, k[:, :1].expand(1, 3, 3, 4).contiguous(), v, None)


def test_fused_sdpa_returns_the_probabilities_in_inference():
    q, k, v = (_randn(1, 2, 3, 4, dtype=torch.float32, seed=s, grad=False) for s in range(3))
    with torch.no_grad():
        out, probs = FusedSDPA.apply(q.to("hpu"), k.to("hpu"), v.to("hpu"), None, 0.0, False, None, "None", None,
                                     None, "left", False, True)  # fmt: skip
    expected = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)
    torch.testing.assert_close(probs.cpu(), expected)
    torch.testing.assert_close(out.cpu(), expected @ v)


def test_recompute_follows_sdp_kernel():
    import habana_frameworks.torch.hpu as hthpu

    assert not hthpu.recompute_sdp_enabled()
    with hthpu.sdp_kernel(enable_recompute=True):
        assert hthpu.recompute_sdp_enabled()
        _check_sdpa("causal", torch.float32)
    assert not hthpu.recompute_sdp_enabled()


def test_pysdpa_is_maskless_attention():
    q, k, v = (_randn(1, 2, 3, 4, dtype=torch.float32, seed=s, grad=False) for s in range(3))
    out = PySDPA.apply(q.to("hpu"), k.to("hpu"), v.to("hpu"), True)
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True))


# --- rotary position embeddings: the formulas of the Transformers models each helper names


def _rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]), dim=-1)


def _rotate_every_two(x):
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def _tables(dtype, positions=10, dim=8):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.outer(torch.arange(positions).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[None, None].to(dtype), emb.sin()[None, None].to(dtype)


def _rope_cases(dtype):
    cos, sin = _tables(dtype)
    position_ids = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])
    pair_cos, pair_sin = cos[..., 2:6, :], sin[..., 2:6, :]
    rope_cache = torch.stack((cos[0, 0, :, :4], sin[0, 0, :, :4]), dim=-1).float()  # ChatGLM: [seq, dim / 4, 2]
    return {
        # name -> (fused function, reference, inputs): p is [batch, heads, seq, dim] (ChatGLM: [seq, batch, heads, dim])
        "V1_offset": (
            lambda p: RotaryPosEmbeddingHelperV1.apply(p, cos.to(p.device), sin.to(p.device), 3),
            lambda p: p * cos[..., 3:7, :] + _rotate_half(p) * sin[..., 3:7, :],
            _randn(2, 3, 4, 8, dtype=dtype),
        ),
        "V2_position_ids": (
            lambda p: RotaryPosEmbeddingHelperV2.apply(
                p, cos.to(p.device), sin.to(p.device), position_ids.to(p.device)
            ),
            lambda p: p * cos[0, 0][position_ids].unsqueeze(1) + _rotate_half(p) * sin[0, 0][position_ids].unsqueeze(1),
            _randn(2, 3, 4, 8, dtype=dtype),
        ),
        "pairwise": (
            lambda p: apply_rotary_pos_emb(
                p, pair_cos.to(p.device), pair_sin.to(p.device), None, 0, RotaryPosEmbeddingMode.PAIRWISE
            ),  # fmt: skip
            lambda p: p * pair_cos + _rotate_every_two(p) * pair_sin,
            _randn(2, 3, 4, 8, dtype=dtype),
        ),
        "V3_rope_cache": (
            lambda p: RotaryPosEmbeddingHelperV3.apply(p, rope_cache.to(p.device)),
            lambda p: _chatglm_rope(p, rope_cache),
            _randn(5, 2, 3, 12, dtype=dtype),
        ),
    }


def _chatglm_rope(p, rope_cache):
    """ChatGLM2's apply_rotary_pos_emb: pairs (x0, x1) of the first rot_dim channels rotated by (cos, sin)."""
    seq, rot_dim = p.shape[0], rope_cache.shape[-2] * 2
    rotated, passed = p[..., :rot_dim], p[..., rot_dim:]
    pairs = rotated.reshape(seq, -1, p.shape[2], rot_dim // 2, 2)
    cache = rope_cache[:seq].view(seq, -1, 1, rot_dim // 2, 2).to(p.dtype)
    out = torch.stack(
        (pairs[..., 0] * cache[..., 0] - pairs[..., 1] * cache[..., 1],
         pairs[..., 1] * cache[..., 0] + pairs[..., 0] * cache[..., 1]), -1,
    )  # fmt: skip
    return torch.cat((out.flatten(3), passed), dim=-1)


def _check_rope(case, dtype, compiled=False):
    fused, reference, p = _rope_cases(dtype)[case]
    expected = _forward_backward(reference, [p], "cpu")
    _assert_matches(_forward_backward(fused, [p], "hpu", compiled), expected, dtype, f"RoPE {case}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(_rope_cases(torch.float32)))
def test_rotary_embeddings_equal_the_models_formulas(case, dtype):
    _check_rope(case, DTYPES[dtype])


@pytest.mark.parametrize("hpu_mode", ["lazy"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_embeddings_in_lazy_mode(hpu_mode, dtype):
    for case in _rope_cases(torch.float32):
        _check_rope(case, DTYPES[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_embeddings_compiled(dtype):
    for case in _rope_cases(torch.float32):
        _check_rope(case, DTYPES[dtype], compiled=True)


# --- softmax and CTC loss


@pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])
@pytest.mark.parametrize("flavor", [0, 1])
def test_custom_softmax_is_softmax_in_bf16(hpu_mode, flavor):
    x = _randn(3, 7, dtype=torch.bfloat16)
    expected = _forward_backward(lambda t: torch.softmax(t, dim=-1), [x], "cpu")
    _assert_matches(_forward_backward(lambda t: CustomSoftmax.apply(t, flavor), [x], "hpu"), expected,
                    torch.bfloat16, "CustomSoftmax")  # fmt: skip


def test_custom_softmax_compiled():
    x = _randn(3, 7, dtype=torch.bfloat16)
    expected = _forward_backward(lambda t: torch.softmax(t, dim=-1), [x], "cpu")
    actual = _forward_backward(lambda t: CustomSoftmax.apply(t, 0), [x], "hpu", compiled=True)
    _assert_matches(actual, expected, torch.bfloat16, "CustomSoftmax compiled")


def test_custom_softmax_is_bf16_only_as_on_gaudi():
    with pytest.raises(TypeError, match="bfloat16 only, got torch.float32"):
        CustomSoftmax.apply(torch.randn(2, 3).to("hpu"), 0)


@pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_ctc_loss_is_torchs(hpu_mode, dtype):
    log_probs = torch.randn(12, 2, 5, generator=torch.Generator().manual_seed(0)).log_softmax(-1).to(DTYPES[dtype])
    targets = torch.tensor([[1, 2, 3], [2, 4, 1]])
    lengths = (torch.tensor([12, 10]), torch.tensor([3, 2]))

    def loss(fn, device):
        return lambda lp: fn(lp, targets.to(device), lengths[0].to(device), lengths[1].to(device)).reshape(1)

    def reference(lp, *args):  # torch has no bfloat16 CTC loss on CPU
        return F.ctc_loss(lp.float(), *args).to(lp.dtype)

    expected = _forward_backward(loss(reference, "cpu"), [log_probs.requires_grad_()], "cpu")
    actual = _forward_backward(loss(CTCLoss.apply, "hpu"), [log_probs], "hpu")
    _assert_matches(actual, expected, DTYPES[dtype], "CTCLoss")


def test_fp8_attention_says_it_is_not_modelled_when_called():
    with pytest.raises(NotImplementedError, match="fp8_fused_sdpa.*not modelled on the virtual Gaudi"):
        fp8_fused_sdpa(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))
