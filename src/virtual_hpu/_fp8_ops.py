"""The bridge's fp8 ops ``torch.ops.hpu.cast_to_fp8_v2``, ``cast_from_fp8``, ``fp8_gemm_v2`` and ``conv2d_fp8`` on
torch's float8 types.

Values really pass through fp8: a cast multiplies by the scale, saturates to the range the device's format can hold
and rounds to the float8 dtype; the GEMM multiplies the fp8 operands with ``torch._scaled_mm`` and applies the inverse
scales; the convolution convolves the fp8 values (exact products, fp32 sums) and applies the inverse scales. Gaudi2's
e4m3 holds at most 240 (torch's ``float8_e4m3fnuz`` range), also when a caller asks for ``float8_e4m3fn``, as Intel
Neural Compressor does; Gaudi3 holds the full ``float8_e4m3fn`` range. First-generation Gaudi has no fp8 and refuses,
as the real device does.
"""

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
    a = A.transpose(-2, -1) if trans_A else A
    b = B.transpose(-2, -1) if trans_B else B
    if b.dim() != 2:
        raise RuntimeError(f"fp8_gemm_v2: B must be a matrix, got shape {tuple(B.shape)}")
    one = torch.ones((), device=A.device)
    # the products are exact in fp32; scaling after the GEMM also covers per-channel scales of B
    out = torch._scaled_mm(
        a.reshape(-1, a.shape[-1]), b.t().contiguous().t(), scale_a=one, scale_b=one, out_dtype=torch.float32
    )
    out = out.reshape(*a.shape[:-1], b.shape[-1])
    for scale in (A_scale_inv, _broadcast(B_scale_inv, B_scale_shape)):
        if scale is not None:
            out = out * (scale.float().reshape(-1) if isinstance(scale, torch.Tensor) and scale.numel() > 1 else scale)
    if bias is not None:
        out = out + bias.float()
    if accumulate:
        if D is None:
            raise RuntimeError("fp8_gemm_v2: accumulate=True needs the output tensor D")
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
        out = out + bias.float().reshape(1, -1, 1, 1)
    return out.to(out_dtype or torch.bfloat16)


for _overload in ("cast_to_fp8_v2", "cast_to_fp8_v2.scalar"):
    _library.impl(_overload, _cast_to_fp8, "CompositeExplicitAutograd")
for _overload in ("cast_from_fp8", "cast_from_fp8.scalar"):
    _library.impl(_overload, _cast_from_fp8, "CompositeExplicitAutograd")
for _overload in ("fp8_gemm_v2", "fp8_gemm_v2.scalar"):
    _library.impl(_overload, _fp8_gemm, "CompositeExplicitAutograd")
for _overload in ("conv2d_fp8", "conv2d_fp8.scalar"):
    _library.impl(_overload, _conv2d_fp8, "CompositeExplicitAutograd")
