"""Transformer Engine ``Linear``: a linear layer whose GEMMs run in fp8 inside ``fp8_autocast``."""

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from habana_frameworks.torch.hpex.experimental.transformer_engine import fp8

# the fp8 tensors of a Linear, in the order of its ScalingState
_INPUT, _WEIGHT, _GRAD_OUTPUT = range(3)


class Linear(nn.Module):
    """``y = x W^T + b`` with fp8 GEMMs inside ``fp8_autocast(enabled=True)`` (output in bfloat16) and a plain linear
    layer outside it. Parameters are named and shaped as in ``torch.nn.Linear``; the fp8 scaling state travels in
    the module's state dict as ``_extra_state``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        params_dtype: Optional[torch.dtype] = None,
        device: Any = "hpu",
        skip_weight_param_allocation: bool = False,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        dtype = params_dtype or torch.get_default_dtype()
        if skip_weight_param_allocation:
            self.register_parameter("weight", None)
        else:
            self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device)) if bias else None
        self.fp8_state = fp8.ScalingState(3, torch.device(device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.kaiming_uniform_(self.weight, a=5**0.5)
        if self.bias is not None:
            bound = 1 / self.in_features**0.5 if self.in_features else 0
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: torch.Tensor, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        weight = self.weight if weight is None else weight
        if not fp8.is_fp8_enabled():
            return F.linear(input, weight, self.bias)
        recipe = fp8.get_fp8_recipe()
        kinds = [recipe.fp8_format.forward, recipe.fp8_format.forward, recipe.fp8_format.backward]
        if self.training:
            self.fp8_state.update(recipe, kinds, fp8.get_fp8_group())
        dtypes = tuple(fp8.fp8_dtype(kind) for kind in kinds)
        bias = self.bias
        return _Fp8Linear.apply(input, weight, bias, self.fp8_state, dtypes, self.training)

    def get_extra_state(self) -> dict[str, Any]:
        return self.fp8_state.state_dict()

    def set_extra_state(self, state: Any) -> None:
        if state is not None:
            self.fp8_state.load_state_dict(state)

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> "Linear":
        super()._apply(fn, *args, **kwargs)
        # the scaling state follows the parameters to their device
        device = self.weight.device if self.weight is not None else self.fp8_state.scale.device
        state = {key: value.to(device) for key, value in self.fp8_state.state_dict().items()}
        self.fp8_state.load_state_dict(state)
        return self

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _cast(tensor: torch.Tensor, state: fp8.ScalingState, index: int, dtype: torch.dtype, record: bool) -> torch.Tensor:
    quantized, amax = torch.ops.hpu.cast_to_fp8_v2(tensor, state.scale[index], False, record, dtype)
    if record:
        state.record(index, amax)
    return quantized


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: Optional[torch.Tensor],
        state: fp8.ScalingState,
        dtypes: tuple[torch.dtype, ...],
        record: bool,
    ) -> torch.Tensor:
        x = _cast(input.reshape(-1, input.shape[-1]), state, _INPUT, dtypes[_INPUT], record)
        w = _cast(weight, state, _WEIGHT, dtypes[_WEIGHT], record)
        scale_inv = state.scale_inv.clone()
        out = torch.ops.hpu.fp8_gemm_v2(
            x, False, w, True, None, torch.bfloat16, scale_inv[_INPUT], scale_inv[_WEIGHT], bias, False
        )
        ctx.save_for_backward(x, w, scale_inv)
        ctx.state, ctx.dtypes, ctx.record = state, dtypes, record
        ctx.shapes = (input.shape, input.dtype, weight.dtype, bias is not None)
        return out.reshape(*input.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Optional[torch.Tensor], ...]:
        x, w, scale_inv = ctx.saved_tensors
        input_shape, input_dtype, weight_dtype, has_bias = ctx.shapes
        grad = grad_output.reshape(-1, grad_output.shape[-1])
        state = ctx.state
        g = _cast(grad, state, _GRAD_OUTPUT, ctx.dtypes[_GRAD_OUTPUT], ctx.record)
        grad_scale_inv = state.scale_inv[_GRAD_OUTPUT].clone()
        grad_input = torch.ops.hpu.fp8_gemm_v2(
            g, False, w, False, None, torch.bfloat16, grad_scale_inv, scale_inv[_WEIGHT], None, False
        )
        grad_weight = torch.ops.hpu.fp8_gemm_v2(
            g, True, x, False, None, torch.float32, grad_scale_inv, scale_inv[_INPUT], None, False
        )
        grad_bias = grad.float().sum(0) if has_bias else None
        return (
            grad_input.reshape(input_shape).to(input_dtype),
            grad_weight.to(weight_dtype),
            None if grad_bias is None else grad_bias.to(weight_dtype),
            None,
            None,
            None,
        )
