"""The bridge's fp8 ops ``torch.ops.hpu.cast_to_fp8_v2``, ``cast_from_fp8``, ``fp8_gemm_v2`` and ``conv2d_fp8`` on
torch's float8 types.

Values really pass through fp8: a cast multiplies by the scale, saturates to the range the device's format can hold
and rounds to the float8 dtype; the GEMM and the convolution widen the fp8 operands to float32 (exactly), multiply
them with float32 sums, as Gaudi's MME accumulates, and apply the inverse scales. Only float32 kernels run, which every
host CPU has: the host's own fp8 kernels (``torch._scaled_mm``) refuse some float8 dtypes on some CPUs. Gaudi2's e4m3
holds at most 240 (torch's ``float8_e4m3fnuz`` range), also when a caller asks for ``float8_e4m3fn``, as Intel Neural
Compressor does; Gaudi3 holds the full ``float8_e4m3fn`` range. First-generation Gaudi has no fp8 and refuses, as the
real device does.

Each op has a fake kernel with the bridge's shape rules, so ``torch.compile`` traces them.
"""

from collections.abc import Sequence
from typing import Optional, Union

import torch

_library = torch.library.Library("hpu", "FRAGMENT")
_library.define(
    "cast_to_fp8_v2(Tensor input, Tensor? scale=None, bool stochastic_rounding=False, bool is_amax=False,"
    " ScalarType dtype=float8_e4m3fn, int[]? scale_shape=None) -> (Tensor, Tensor)"
)
_library.define(
    "cast_to_fp8_v2.scalar(Tensor input, float scale, bool stochastic_rounding=False, bool is_amax=False,"
    " ScalarType dtype=float8_e4m3fn, int[]? scale_shape=None) -> (Tensor, Tensor)"
)
_library.define("cast_from_fp8(Tensor input, Tensor? scale, ScalarType out_dtype, int[]? scale_shape=None) -> Tensor")
_library.define(
    "cast_from_fp8.scalar(Tensor input, float scale, ScalarType out_dtype, int[]? scale_shape=None) -> Tensor"
)
_GEMM_ARGS = "Tensor A, bool trans_A, Tensor B, bool trans_B, Tensor? D, ScalarType out_dtype"
_GEMM_TAIL = "Tensor? bias=None, bool accumulate=False, int[]? B_scale_shape=None"
_GEMM_SCALES = "Tensor? A_scale_inv=None, Tensor? B_scale_inv=None"
_library.define(f"fp8_gemm_v2({_GEMM_ARGS}, {_GEMM_SCALES}, {_GEMM_TAIL}) -> Tensor")
_library.define(f"fp8_gemm_v2.scalar({_GEMM_ARGS}, float A_scale_inv, float B_scale_inv, {_GEMM_TAIL}) -> Tensor")
_CONV_ARGS = (
    "Tensor input, Tensor weight, Tensor? bias=None, int[] stride=[1, 1], int[] padding=[0, 0],"
    " int[] dilation=[1, 1], int groups=1, ScalarType? out_dtype=None"
)
_library.define(f"conv2d_fp8({_CONV_ARGS}, Tensor? scale_input=None, Tensor? scale_weight=None) -> Tensor")
_library.define(f"conv2d_fp8.scalar({_CONV_ARGS}, float scale_input=1.0, float scale_weight=1.0) -> Tensor")

_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2)
_GAUDI2_E4M3_MAX = 240.0
_MANTISSA_BITS = {torch.float8_e4m3fn: 3, torch.float8_e4m3fnuz: 3, torch.float8_e5m2: 2}

Scale = Union[torch.Tensor, float, None]


def fp8_max(dtype: torch.dtype) -> float:
    """The largest value the current device stores in ``dtype``."""
    import virtual_hpu

    _check_supported()
    if dtype == torch.float8_e4m3fn and virtual_hpu.config().generation == "GAUDI2":
        return _GAUDI2_E4M3_MAX
    return torch.finfo(dtype).max


def _check_supported() -> None:
    import virtual_hpu

    if not virtual_hpu.config().fp8_supported:
        raise RuntimeError(
            f"fp8 is not supported on {virtual_hpu.config().generation}: it needs Gaudi2 or newer."
            " Use bfloat16 on first-generation Gaudi."
        )


def _check_fp8(tensor: torch.Tensor, name: str) -> None:
    if tensor.dtype not in _FP8_DTYPES:
        raise RuntimeError(f"{name} must be an fp8 tensor ({', '.join(map(str, _FP8_DTYPES))}), got {tensor.dtype}")


def _broadcast(scale: Scale, scale_shape: Optional[list[int]]) -> Scale:
    if isinstance(scale, torch.Tensor) and scale_shape:
        return scale.reshape(scale_shape)
    return scale


def _cast_to_fp8(
    input: torch.Tensor,
    scale: Scale = None,
    stochastic_rounding: bool = False,
    is_amax: bool = False,
    dtype: torch.dtype = torch.float8_e4m3fn,
    scale_shape: Optional[list[int]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if dtype not in _FP8_DTYPES:
        raise RuntimeError(f"cast_to_fp8_v2: dtype must be one of {', '.join(map(str, _FP8_DTYPES))}, got {dtype}")
    limit = fp8_max(dtype)
    values = input.float()
    amax = values.abs().amax() if is_amax else torch.empty(0, device=input.device)
    if scale is not None:
        values = values * _broadcast(scale, scale_shape)
    if stochastic_rounding:
        values = _round_stochastically(values, dtype)
    return values.clamp(-limit, limit).to(dtype), amax


def _round_stochastically(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round to one of the two neighbouring values of the fp8 grid, the nearer one being the likelier."""
    finfo = torch.finfo(dtype)
    exponent = torch.floor(torch.log2(values.abs().clamp_min(finfo.tiny)))
    spacing = torch.exp2(exponent - _MANTISSA_BITS[dtype])
    lower = torch.floor(values / spacing) * spacing
    return torch.where(torch.rand_like(values) * spacing < values - lower, lower + spacing, lower)


def _cast_from_fp8(
    input: torch.Tensor, scale: Scale, out_dtype: torch.dtype, scale_shape: Optional[list[int]] = None
) -> torch.Tensor:
    _check_supported()
    _check_fp8(input, "cast_from_fp8: input")
    values = input.float()
    if scale is not None:
        values = values * _broadcast(scale, scale_shape)
    return values.to(out_dtype)


def _gemm_shape(a: Sequence[int], b: Sequence[int], trans_a: bool, trans_b: bool) -> list[int]:
    """The output shape of ``A @ B`` after the transposes: torch.matmul's rules (a 1-D operand is a vector, the
    batch dimensions broadcast), checked with the bridge's messages."""
    rows = [a[-1] if trans_a else a[-2]] if len(a) > 1 else []
    columns = [b[-2] if trans_b else b[-1]] if len(b) > 1 else []
    common_a = a[-2] if trans_a and len(a) > 1 else a[-1]
    common_b = b[-1] if trans_b or len(b) == 1 else b[-2]
    if common_a != common_b:
        raise RuntimeError(
            f"fp8_gemm_v2: common dimension sizes of matmul inputs should be the same. Got {common_a} and {common_b}"
        )
    batch = []
    for i in range(3, max(len(a), len(b)) + 1):
        dim_a, dim_b = a[-i] if i <= len(a) else 1, b[-i] if i <= len(b) else 1
        if dim_a != dim_b and 1 not in (dim_a, dim_b):
            raise RuntimeError(
                f"fp8_gemm_v2: batch dimensions of matmul inputs should be the same or 1. Got {dim_a} and {dim_b}"
            )
        batch.insert(0, dim_a if dim_b == 1 else dim_b)
    return batch + rows + columns


def _fp8_gemm(
    A: torch.Tensor,
    trans_A: bool,
    B: torch.Tensor,
    trans_B: bool,
    D: Optional[torch.Tensor],
    out_dtype: torch.dtype,
    A_scale_inv: Scale = None,
    B_scale_inv: Scale = None,
    bias: Optional[torch.Tensor] = None,
    accumulate: bool = False,
    B_scale_shape: Optional[list[int]] = None,
) -> torch.Tensor:
    _check_supported()
    _check_fp8(A, "fp8_gemm_v2: A")
    _check_fp8(B, "fp8_gemm_v2: B")
    _gemm_shape(A.shape, B.shape, trans_A, trans_B)  # refuses what the bridge refuses, with its messages
    if accumulate and D is None:
        raise RuntimeError("fp8_gemm_v2: accumulate=True needs the output tensor D")
    a = A.float().transpose(-2, -1) if trans_A and A.dim() > 1 else A.float()
    b = B.float().transpose(-2, -1) if trans_B and B.dim() > 1 else B.float()
    # products of fp8 values are exact in float32; scaling after the GEMM also covers per-channel scales of B
    out = torch.matmul(a, b)
    for scale in (A_scale_inv, _broadcast(B_scale_inv, B_scale_shape)):
        if scale is not None:
            out = out * (scale.float().reshape(-1) if isinstance(scale, torch.Tensor) and scale.numel() > 1 else scale)
    if bias is not None:
        out = out + bias.float()
    if accumulate:
        out = out + D.float()
    return out.to(out_dtype)


def _conv2d_fp8(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    stride: tuple = (1, 1),
    padding: tuple = (0, 0),
    dilation: tuple = (1, 1),
    groups: int = 1,
    out_dtype: Optional[torch.dtype] = None,
    scale_input: Scale = None,
    scale_weight: Scale = None,
) -> torch.Tensor:
    _check_supported()
    _check_fp8(input, "conv2d_fp8: input")
    _check_fp8(weight, "conv2d_fp8: weight")
    out = torch.nn.functional.conv2d(input.float(), weight.float(), None, stride, padding, dilation, groups)
    for scale in (scale_input, scale_weight):
        if scale is not None:
            out = out * scale
    if bias is not None:
        out = out + bias.float().reshape(-1, 1, 1)
    return out.to(out_dtype or torch.bfloat16)


def _cast_to_fp8_fake(
    input: torch.Tensor,
    scale: Scale = None,
    stochastic_rounding: bool = False,
    is_amax: bool = False,
    dtype: torch.dtype = torch.float8_e4m3fn,
    scale_shape: Optional[list[int]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    # as the bridge: a 0-dim amax when asked for, otherwise an empty one
    return input.new_empty(input.shape, dtype=dtype), input.new_empty(() if is_amax else (0,), dtype=torch.float32)


def _cast_from_fp8_fake(
    input: torch.Tensor, scale: Scale, out_dtype: torch.dtype, scale_shape: Optional[list[int]] = None
) -> torch.Tensor:
    return input.new_empty(input.shape, dtype=out_dtype)


def _fp8_gemm_fake(
    A: torch.Tensor,
    trans_A: bool,
    B: torch.Tensor,
    trans_B: bool,
    D: Optional[torch.Tensor],
    out_dtype: torch.dtype,
    *_: object,
) -> torch.Tensor:
    return A.new_empty(_gemm_shape(A.shape, B.shape, trans_A, trans_B), dtype=out_dtype)


def _conv2d_fp8_fake(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    stride: Sequence[int] = (1, 1),
    padding: Sequence[int] = (0, 0),
    dilation: Sequence[int] = (1, 1),
    groups: int = 1,
    out_dtype: Optional[torch.dtype] = None,
    *_: Scale,
) -> torch.Tensor:
    # a one-element list stands for both spatial dimensions, as in the bridge
    stride, padding, dilation = (list(v) * 2 if len(v) == 1 else list(v) for v in (stride, padding, dilation))
    spatial = [
        (size + 2 * pad - dil * (kernel - 1) - 1) // step + 1
        for size, kernel, step, pad, dil in zip(input.shape[-2:], weight.shape[-2:], stride, padding, dilation)
    ]
    return input.new_empty((*input.shape[:-3], weight.shape[0], *spatial), dtype=out_dtype or torch.bfloat16)


for _name, _kernel, _fake in (
    ("cast_to_fp8_v2", _cast_to_fp8, _cast_to_fp8_fake),
    ("cast_from_fp8", _cast_from_fp8, _cast_from_fp8_fake),
    ("fp8_gemm_v2", _fp8_gemm, _fp8_gemm_fake),
    ("conv2d_fp8", _conv2d_fp8, _conv2d_fp8_fake),
):
    for _overload in (_name, f"{_name}.scalar"):
        _library.impl(_overload, _kernel, "CompositeExplicitAutograd")
        torch.library.register_fake(f"hpu::{_overload}", _fake, lib=_library)
