"""Which ops ``torch.autocast("hpu")`` runs in lower precision and which in fp32.

Defaults are Habana's documented lists for Gaudi. As Intel's bridge (1.19 and newer) does, the files (one op per line)
named by ``PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST`` / ``PT_HPU_AUTOCAST_FP32_OPS_LIST`` replace them once, when the
device is activated (the bridge reads them when its library loads); changing the variables later changes nothing.
``set_op_lists`` replaces the lists at run time, for the virtual Gaudi's own tests: the real bridge has no such call.
An op in both lists runs in lower precision, as on Gaudi.
"""

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

import torch

from virtual_hpu import op_names

DEFAULT_LOWER = (
    "addmm",
    "addbmm",
    "batch_norm",
    "baddbmm",
    "bmm",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "dot",
    "dropout",
    "feature_dropout",
    "group_norm",
    "instance_norm",
    "layer_norm",
    "leaky_relu",
    "linear",
    "matmul",
    "mean",
    "mm",
    "mul",
    "mv",
    "softmax",
    "log_softmax",
    "scaled_dot_product_attention",
)
DEFAULT_FP32 = (
    "acos",
    "addcdiv",
    "asin",
    "atan2",
    "bilinear",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "cdist",
    "cosh",
    "cosine_embedding_loss",
    "cosine_similarity",
    "cross_entropy_loss",
    "dist",
    "div",
    "divide",
    "embedding",
    "embedding_bag",
    "erfinv",
    "exp",
    "expm1",
    "hinge_embedding_loss",
    "huber_loss",
    "kl_div",
    "l1_loss",
    "log",
    "log10",
    "log1p",
    "log2",
    "logsumexp",
    "margin_ranking_loss",
    "mse_loss",
    "multi_margin_loss",
    "multilabel_margin_loss",
    "nll_loss",
    "pdist",
    "poisson_nll_loss",
    "pow",
    "reciprocal",
    "renorm",
    "rsqrt",
    "sinh",
    "smooth_l1_loss",
    "soft_margin_loss",
    "softplus",
    "tan",
    "topk",
    "triplet_margin_loss",
    "true_divide",
)
# Their CPU kernels take a low-precision input with fp32 weights and statistics; only the input is cast so that
# running statistics keep being updated in place.
INPUT_ONLY = frozenset({"batch_norm", "instance_norm", "group_norm", "layer_norm"})

# the variables Intel's bridge 1.19 and newer reads; it ignores the names older Gaudi software read (LOWER_LIST,
# FP32_LIST), silently, and so does the virtual Gaudi
LOWER_VARIABLE = "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"
FP32_VARIABLE = "PT_HPU_AUTOCAST_FP32_OPS_LIST"

_lower: tuple[str, ...] = ()
_fp32: tuple[str, ...] = ()


def set_op_lists(lower: Optional[Iterable[str]] = None, fp32: Optional[Iterable[str]] = None) -> None:
    """Replace the lower-precision and/or fp32 op lists (``None`` keeps a list). Names are aten op names or the
    aliases Gaudi's lists use (``virtual_hpu.op_names``); any other name raises ``ValueError`` with the closest."""
    global _lower, _fp32
    new_lower = _lower if lower is None else op_names.resolve(lower, "The lower-precision list")
    new_fp32 = _fp32 if fp32 is None else op_names.resolve(fp32, "The fp32 list")
    lower_ops, input_ops, fp32_ops = [], [], []
    for name in new_lower:
        (input_ops if name in INPUT_ONLY else lower_ops).extend(op_names.overloads(name))
    for name in new_fp32:
        if name not in new_lower:
            fp32_ops.extend(op_names.overloads(name))
    torch.ops.virtual_hpu.set_autocast_ops(lower_ops, input_ops, fp32_ops)
    _lower, _fp32 = new_lower, new_fp32


def op_lists() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The current ``(lower, fp32)`` op lists."""
    return _lower, _fp32


def _read_list(variable: str) -> Optional[list[str]]:
    path = os.environ.get(variable)
    if not path:
        return None
    try:
        names = Path(path).read_text().splitlines()
    except OSError as err:
        raise ValueError(f"{variable}={path!r} cannot be read: {err}") from err
    return list(op_names.resolve(names, f"{variable}={path!r}"))


def set_op_lists_from_env() -> None:
    """Install the default lists, replaced by the files named in ``PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST`` /
    ``PT_HPU_AUTOCAST_FP32_OPS_LIST`` if set; called once, when the virtual Gaudi is activated."""
    lower = _read_list(LOWER_VARIABLE)
    fp32 = _read_list(FP32_VARIABLE)
    set_op_lists(
        lower if lower is not None else DEFAULT_LOWER,
        fp32 if fp32 is not None else DEFAULT_FP32,
    )
