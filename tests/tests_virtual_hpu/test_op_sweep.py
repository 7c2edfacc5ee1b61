"""Every op on Gaudi's autocast lists and every op the transformer models use gives on hpu what its CPU kernel
gives: same output dtypes, same values, same gradients, in bf16 and fp16.

Three input regimes per op and precision:

- ``autocast``: fp32 activations and parameters under ``torch.autocast("hpu")`` (the first layer of a
  ``bf16-mixed`` model);
- ``autocast-low``: activations already in the low precision (the output of a previous op), fp32 parameters,
  under autocast;
- ``mixed``: the same mixed inputs without autocast (how normalisations and losses receive them in the
  backward of a mixed-precision model).

The CPU reference applies Gaudi's policy by hand: the op's inputs cast as ``torch.autocast("hpu")`` casts them
(all to the low precision, only the activation for normalisations, all to fp32, or none for unlisted ops), then the
op runs on CPU without autocast. The virtual device runs the same CPU kernels, so results must be bit-identical.
Where the CPU kernel refuses a dtype mix, hpu must refuse it too.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import pytest
import torch
import torch.nn.functional as F

from tests_virtual_hpu.sdpa_reference import backends_as_on_hpu
from virtual_hpu import autocast

PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16}
REGIMES = ("autocast", "autocast-low", "mixed")


@dataclass(frozen=True)
class Arg:
    """How to build one input: ``kind`` is ``act`` (activation, takes the regime's dtype and requires grad),
    ``param`` (fp32, requires grad), ``buffer`` (fp32, no grad) or ``index`` (int64 in ``[0, high)``)."""

    kind: str
    shape: tuple[int, ...]
    low: float = -1.0
    high: float = 1.0


def act(*shape: int, low: float = -1.0, high: float = 1.0) -> Arg:
    return Arg("act", shape, low, high)


def param(*shape: int) -> Arg:
    return Arg("param", shape)


def buffer(*shape: int, low: float = 0.5, high: float = 1.5) -> Arg:
    return Arg("buffer", shape, low, high)


def index(high: int, *shape: int) -> Arg:
    return Arg("index", shape, 0, high)


def sign(*shape: int) -> Arg:
    return Arg("sign", shape)


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable
    args: tuple[Arg, ...]
    # The aten op whose autocast policy applies to the call (None: not intercepted by autocast).
    op: Optional[str] = None
    # Composites that call ops of different autocast policies inside have no one-cast CPU reference: they are
    # compared without autocast, and their ops one by one above.
    regimes: tuple[str, ...] = REGIMES
    # Its backward computes in float64, which Gaudi holds in float32: hpu is as close as float32 allows.
    float64_inside: bool = False


def _rms_norm(x, weight):  # Llama's RMSNorm, written in plain ops
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return weight * (x.float() * torch.rsqrt(variance + 1e-6)).to(x.dtype)


def _rotary(x, cos, sin):  # Llama's rotate_half embedding
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _sdpa(q, k, v):  # with the backend torch takes on hpu, on either device
    with backends_as_on_hpu(q.device):
        return F.scaled_dot_product_attention(q, k, v)


def _causal_scores(q, k):  # GPT-2's attention weights: masked_fill with a causal mask, then softmax
    scores = torch.matmul(q, k.transpose(-1, -2)) / 2.0
    mask = torch.ones(scores.shape[-2:], dtype=torch.bool).tril().to(scores.device)
    scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
    return scores.softmax(-1)


CASES = [
    # Gaudi's lower-precision list
    Case("addmm", torch.addmm, (act(3, 5), act(3, 4), param(4, 5)), "addmm"),
    Case("addbmm", torch.addbmm, (act(3, 5), act(2, 3, 4), param(2, 4, 5)), "addbmm"),
    Case(
        "batch_norm_train",
        lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=True),
        (act(4, 3, 5), buffer(3), buffer(3), param(3), param(3)),
        "batch_norm",
    ),
    Case(
        "batch_norm_eval",
        lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False),
        (act(4, 3, 5), buffer(3), buffer(3), param(3), param(3)),
        "batch_norm",
    ),
    Case("baddbmm", torch.baddbmm, (act(2, 3, 5), act(2, 3, 4), param(2, 4, 5)), "baddbmm"),
    Case("bmm", torch.bmm, (act(2, 3, 4), act(2, 4, 5)), "bmm"),
    Case("conv1d", F.conv1d, (act(2, 3, 8), param(4, 3, 3), param(4)), "conv1d"),
    Case("conv2d", F.conv2d, (act(2, 3, 5, 5), param(4, 3, 3, 3), param(4)), "conv2d"),
    Case("conv3d", F.conv3d, (act(1, 2, 4, 4, 4), param(3, 2, 3, 3, 3), param(3)), "conv3d"),
    Case("conv_transpose1d", F.conv_transpose1d, (act(2, 3, 6), param(3, 4, 3), param(4)), "conv_transpose1d"),
    Case("conv_transpose2d", F.conv_transpose2d, (act(2, 3, 4, 4), param(3, 4, 3, 3), param(4)), "conv_transpose2d"),
    Case(
        "conv_transpose3d",
        F.conv_transpose3d,
        (act(1, 2, 3, 3, 3), param(2, 3, 2, 2, 2), param(3)),
        "conv_transpose3d",
    ),
    Case("dot", torch.dot, (act(5), act(5)), "dot"),
    Case("dropout", lambda x: F.dropout(x, 0.5, training=True), (act(4, 6),), "dropout"),
    Case("feature_dropout", lambda x: F.dropout2d(x, 0.5, training=True), (act(2, 4, 3, 3),), "feature_dropout"),
    Case("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b), (act(2, 4, 5), param(4), param(4)), "group_norm"),
    Case(
        "instance_norm",
        lambda x, w, b: F.instance_norm(x, weight=w, bias=b),
        (act(2, 3, 5), param(3), param(3)),
        "instance_norm",
    ),
    Case(
        "instance_norm_running",
        lambda x, m, v: F.instance_norm(x, m, v, use_input_stats=True),
        (act(2, 3, 5), buffer(3), buffer(3)),
        "instance_norm",
    ),
    Case("layer_norm", lambda x, w, b: F.layer_norm(x, (6,), w, b), (act(2, 3, 6), param(6), param(6)), "layer_norm"),
    Case("layer_norm_no_affine", lambda x: F.layer_norm(x, (6,)), (act(2, 3, 6),), "layer_norm"),
    Case("leaky_relu", lambda x: F.leaky_relu(x, 0.1), (act(3, 4),), "leaky_relu"),
    Case("linear", F.linear, (act(2, 3, 4), param(5, 4), param(5)), "linear"),
    Case("matmul", torch.matmul, (act(2, 3, 4), param(4, 5)), "matmul"),
    Case("mean", lambda x: x.mean(-1), (act(3, 4),), "mean"),
    Case("mm", torch.mm, (act(3, 4), param(4, 5)), "mm"),
    Case("mul", torch.mul, (act(3, 4), act(3, 4)), "mul"),
    Case("mv", torch.mv, (param(3, 4), act(4)), "mv"),
    Case("softmax", lambda x: F.softmax(x, -1), (act(3, 5),), "softmax"),
    Case("log_softmax", lambda x: F.log_softmax(x, -1), (act(3, 5),), "log_softmax"),
    Case(
        "sdpa",
        _sdpa,
        (act(2, 2, 4, 8), act(2, 2, 4, 8), act(2, 2, 4, 8)),
        "scaled_dot_product_attention",
    ),
    # Gaudi's fp32 list
    Case("acos", torch.acos, (act(3, 4, low=-0.9, high=0.9),), "acos"),
    Case("addcdiv", torch.addcdiv, (act(3, 4), act(3, 4), act(3, 4, low=0.5, high=2)), "addcdiv"),
    Case("asin", torch.asin, (act(3, 4, low=-0.9, high=0.9),), "asin"),
    Case("atan2", torch.atan2, (act(3, 4), act(3, 4)), "atan2"),
    Case("bilinear", F.bilinear, (act(3, 4), act(3, 5), param(6, 4, 5), param(6)), "bilinear"),
    Case(
        "binary_cross_entropy",
        F.binary_cross_entropy,
        (act(3, 4, low=0.1, high=0.9), buffer(3, 4, low=0, high=1)),
        "binary_cross_entropy",
    ),
    Case(
        "binary_cross_entropy_with_logits",
        F.binary_cross_entropy_with_logits,
        (act(3, 4), buffer(3, 4, low=0, high=1)),
        "binary_cross_entropy_with_logits",
    ),
    Case("cdist", torch.cdist, (act(3, 4), act(5, 4)), "cdist"),
    Case("cosh", torch.cosh, (act(3, 4),), "cosh"),
    Case("cosine_embedding_loss", F.cosine_embedding_loss, (act(3, 4), act(3, 4), sign(3)), "cosine_embedding_loss"),
    Case("cosine_similarity", F.cosine_similarity, (act(3, 4), act(3, 4)), "cosine_similarity"),
    Case("cross_entropy", F.cross_entropy, (act(4, 6), index(6, 4)), "cross_entropy_loss"),
    Case(
        "cross_entropy_smoothing",
        lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1, ignore_index=2),
        (act(4, 6), index(6, 4)),
        "cross_entropy_loss",
    ),
    Case("dist", torch.dist, (act(3, 4), act(3, 4)), "dist"),
    Case("div", torch.div, (act(3, 4), act(3, 4, low=0.5, high=2)), "div"),
    Case("divide", torch.divide, (act(3, 4), act(3, 4, low=0.5, high=2)), "divide"),
    Case("embedding", F.embedding, (index(10, 2, 5), param(10, 4)), "embedding"),
    Case(
        "embedding_bag",
        lambda i, w, o: F.embedding_bag(i, w, o),
        (index(10, 6), param(10, 4), Arg("offsets", (2,))),
        "embedding_bag",
    ),
    Case("erfinv", torch.erfinv, (act(3, 4, low=-0.9, high=0.9),), "erfinv"),
    Case("exp", torch.exp, (act(3, 4),), "exp"),
    Case("expm1", torch.expm1, (act(3, 4),), "expm1"),
    Case("hinge_embedding_loss", F.hinge_embedding_loss, (act(3, 4), sign(3, 4)), "hinge_embedding_loss"),
    Case("huber_loss", F.huber_loss, (act(3, 4), act(3, 4)), "huber_loss"),
    Case(
        "kl_div",
        lambda x, t: F.kl_div(x, t, reduction="batchmean"),
        (act(3, 4), buffer(3, 4, low=0.1, high=0.9)),
        "kl_div",
    ),
    Case("l1_loss", F.l1_loss, (act(3, 4), act(3, 4)), "l1_loss"),
    Case("log", torch.log, (act(3, 4, low=0.5, high=2),), "log"),
    Case("log10", torch.log10, (act(3, 4, low=0.5, high=2),), "log10"),
    Case("log1p", torch.log1p, (act(3, 4, low=0.5, high=2),), "log1p"),
    Case("log2", torch.log2, (act(3, 4, low=0.5, high=2),), "log2"),
    Case("logsumexp", lambda x: torch.logsumexp(x, -1), (act(3, 4),), "logsumexp"),
    Case("margin_ranking_loss", F.margin_ranking_loss, (act(4), act(4), sign(4)), "margin_ranking_loss"),
    Case("mse_loss", F.mse_loss, (act(3, 4), act(3, 4)), "mse_loss"),
    Case("multi_margin_loss", F.multi_margin_loss, (act(4, 5), index(5, 4)), "multi_margin_loss"),
    Case("multilabel_margin_loss", F.multilabel_margin_loss, (act(3, 4), index(4, 3, 4)), "multilabel_margin_loss"),
    Case("nll_loss", F.nll_loss, (act(4, 6), index(6, 4)), "nll_loss"),
    Case("pdist", F.pdist, (act(4, 3),), "pdist"),
    Case("poisson_nll_loss", F.poisson_nll_loss, (act(3, 4), buffer(3, 4)), "poisson_nll_loss"),
    Case("pow", lambda x: torch.pow(x, 2.5), (act(3, 4, low=0.5, high=2),), "pow"),
    Case("pow_tensor", torch.pow, (act(3, 4, low=0.5, high=2), act(3, 4)), "pow"),
    Case("reciprocal", torch.reciprocal, (act(3, 4, low=0.5, high=2),), "reciprocal"),
    Case("renorm", lambda x: torch.renorm(x, 2, 0, 1.0), (act(3, 4),), "renorm", float64_inside=True),
    Case("rsqrt", torch.rsqrt, (act(3, 4, low=0.5, high=2),), "rsqrt"),
    Case("sinh", torch.sinh, (act(3, 4),), "sinh"),
    Case("smooth_l1_loss", F.smooth_l1_loss, (act(3, 4), act(3, 4)), "smooth_l1_loss"),
    Case("soft_margin_loss", F.soft_margin_loss, (act(3, 4), sign(3, 4)), "soft_margin_loss"),
    Case("softplus", F.softplus, (act(3, 4),), "softplus"),
    Case("tan", torch.tan, (act(3, 4, low=-0.9, high=0.9),), "tan"),
    Case("topk", lambda x: torch.topk(x, 2).values, (act(3, 5),), "topk"),
    Case("triplet_margin_loss", F.triplet_margin_loss, (act(3, 4), act(3, 4), act(3, 4)), "triplet_margin_loss"),
    Case("true_divide", torch.true_divide, (act(3, 4), act(3, 4, low=0.5, high=2)), "true_divide"),
    # Unlisted ops of GPT-2, BERT, Llama, T5 and ViT: they run in their inputs' dtypes
    Case("add", torch.add, (act(3, 4), param(3, 4))),
    Case("sub", torch.sub, (act(3, 4), act(3, 4))),
    Case("gelu", F.gelu, (act(3, 4),)),
    Case("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), (act(3, 4),)),
    Case("silu", F.silu, (act(3, 4),)),
    Case("relu", F.relu, (act(3, 4),)),
    Case("tanh", torch.tanh, (act(3, 4),)),
    Case("sigmoid", torch.sigmoid, (act(3, 4),)),
    Case("sqrt", torch.sqrt, (act(3, 4, low=0.5, high=2),)),
    Case("abs", torch.abs, (act(3, 4),)),
    Case("clamp", lambda x: x.clamp(-0.5, 0.5), (act(3, 4),)),
    Case("sum", lambda x: x.sum(-1), (act(3, 4),)),
    Case("amax", lambda x: x.amax(-1), (act(3, 4),)),
    Case("cumsum", lambda x: x.cumsum(-1), (act(3, 4),)),
    Case("cat", lambda x, y: torch.cat((x, y), -1), (act(3, 4), act(3, 2))),
    Case("stack", lambda x, y: torch.stack((x, y)), (act(3, 4), act(3, 4))),
    Case("transpose_contiguous", lambda x: x.transpose(0, 1).contiguous().view(-1), (act(3, 4),)),
    Case("masked_fill", lambda x: x.masked_fill(torch.eye(4, dtype=torch.bool).to(x.device), -1e4), (act(4, 4),)),
    Case("where", lambda x, y: torch.where(x > 0, x, y), (act(3, 4), act(3, 4))),
    Case("gather", lambda x, i: x.gather(-1, i), (act(3, 4), index(4, 3, 2))),
    Case("index_select", lambda x, i: x.index_select(0, i), (act(5, 3), index(5, 4))),
    Case("indexing", lambda x, i: x[i], (act(5, 3), index(5, 4))),
    Case("scatter_add", lambda x, i, s: x.scatter_add(0, i, s), (act(3, 4), index(3, 2, 4), act(2, 4))),
    Case("max_pool2d", lambda x: F.max_pool2d(x, 2), (act(1, 2, 4, 4),)),
    Case("avg_pool2d", lambda x: F.avg_pool2d(x, 2), (act(1, 2, 4, 4),)),
    Case("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, 1), (act(1, 2, 4, 4),), "mean"),  # a mean
    Case("interpolate", lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), (act(1, 2, 3, 3),)),
    Case("pad", lambda x: F.pad(x, (1, 2)), (act(3, 4),)),
    Case("einsum", lambda q, k: torch.einsum("bhqd,bhkd->bhqk", q, k), (act(1, 2, 3, 4), act(1, 2, 5, 4)), "bmm"),
    Case("outer", torch.outer, (act(3), act(4)), "mul"),
    Case("norm", lambda x: x.norm(dim=-1), (act(3, 4),)),
    Case("rotary_embedding", _rotary, (act(2, 3, 4), param(3, 4), param(3, 4)), "mul", regimes=REGIMES[1:]),
    Case("rms_norm_plain_ops", _rms_norm, (act(2, 3, 6), param(6)), regimes=("mixed",)),
    Case("rms_norm", lambda x, w: F.rms_norm(x, (6,), w), (act(2, 3, 6), param(6)), regimes=("mixed",)),
    Case("causal_attention_weights", _causal_scores, (act(1, 2, 3, 4), act(1, 2, 3, 4)), regimes=("mixed",)),
]


def _make_inputs(case: Case, regime: str, low: torch.dtype, device: str) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    inputs = []
    for arg in case.args:
        if arg.kind == "index":
            t = torch.randint(int(arg.high), arg.shape, generator=generator)
        elif arg.kind == "offsets":
            t = torch.tensor([0, 3])
        elif arg.kind == "sign":
            t = torch.randint(2, arg.shape, generator=generator).float() * 2 - 1
        else:
            t = torch.rand(arg.shape, generator=generator) * (arg.high - arg.low) + arg.low
            if arg.kind == "act" and regime != "autocast":
                t = t.to(low)
        t = t.to(device)
        if arg.kind in ("act", "param"):
            t.requires_grad_()
        inputs.append(t)
    return inputs


def _policy(case: Case) -> str:
    lower, fp32 = autocast.op_lists()
    if case.op in lower:
        return "input" if case.op in autocast.INPUT_ONLY else "lower"
    return "fp32" if case.op in fp32 else "none"


def _cast_as_gaudi_autocast(case: Case, inputs: list[torch.Tensor], low: torch.dtype) -> list[torch.Tensor]:
    policy = _policy(case)
    cast = []
    for position, t in enumerate(inputs):
        if t.is_floating_point() and (policy == "lower" or (policy == "input" and position == 0)):
            t = t.to(low)
        elif t.is_floating_point() and policy == "fp32":
            t = t.float()
        cast.append(t)
    return cast


def _run(case: Case, inputs: list[torch.Tensor], device: str, regime: str, low: torch.dtype) -> dict:
    """The output and the gradients of the inputs that require grad, or the exception each direction raised."""
    torch.manual_seed(1)
    try:
        if regime == "mixed":
            out = case.fn(*inputs)
        elif device == "hpu":
            with torch.autocast("hpu", dtype=low):
                out = case.fn(*inputs)
        else:
            out = case.fn(*_cast_as_gaudi_autocast(case, inputs, low))
    except (RuntimeError, TypeError) as err:
        return {"forward": err}
    try:
        weights = torch.linspace(-1, 1, out.numel()).view(out.shape).to(device)
        (out.float() * weights).sum().backward()
    except (RuntimeError, TypeError) as err:
        return {"forward": [out.detach().cpu()], "backward": err}
    grads = [t.grad.cpu() if t.grad is not None else None for t in inputs if t.requires_grad]
    return {"forward": [out.detach().cpu()], "backward": grads}


def _assert_same(where: str, actual, expected, exact: bool) -> None:
    if isinstance(expected, Exception):
        assert isinstance(actual, type(expected)), f"{where}: CPU raises {expected!r}, hpu gives {actual!r}"
        return
    assert not isinstance(actual, Exception), f"{where}: hpu raises {actual!r}, CPU computes it"
    for i, (tensor, reference) in enumerate(zip(actual, expected)):
        assert (tensor is None) == (reference is None), f"{where}, tensor {i}: defined on one device only"
        if tensor is None:
            continue
        assert tensor.dtype == reference.dtype, f"{where}, tensor {i}: {tensor.dtype}, CPU gives {reference.dtype}"
        tolerance = {"rtol": 0, "atol": 0} if exact else {}
        torch.testing.assert_close(tensor, reference, **tolerance, equal_nan=True, msg=lambda m: f"{where}: {m}")


@pytest.fixture(autouse=True)
def _gaudi_default_lists():
    lower, fp32 = autocast.op_lists()
    autocast.set_op_lists(autocast.DEFAULT_LOWER, autocast.DEFAULT_FP32)
    yield
    autocast.set_op_lists(lower, fp32)


def test_every_listed_op_is_swept():
    swept = {case.op for case in CASES}
    assert set(autocast.DEFAULT_LOWER) <= swept
    assert set(autocast.DEFAULT_FP32) <= swept


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize(
    ("case", "regime"),
    [(case, regime) for case in CASES for regime in case.regimes],
    ids=[f"{case.name}-{regime}" for case in CASES for regime in case.regimes],
)
def test_op_matches_cpu(case, regime, precision):
    low = PRECISIONS[precision]
    expected = _run(case, _make_inputs(case, regime, low, "cpu"), "cpu", regime, low)
    actual = _run(case, _make_inputs(case, regime, low, "hpu"), "hpu", regime, low)
    for direction in ("forward", "backward"):
        where = f"{case.name} in {precision} ({regime}), {direction}"
        _assert_same(where, actual.get(direction), expected[direction], exact=not case.float64_inside)
        if isinstance(expected[direction], Exception):
            break
