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
        if self.fp8_state.scale.device != input.device:
            # parameters moved without the module (DeepSpeed's ZeRO flattens them into buffers on the device): the
            # scaling state joins the input, as Transformer Engine sets its fp8 metadata up in the first fp8 forward
            self.fp8_state.to(input.device)
        recipe = fp8.get_fp8_recipe()
        kinds = [recipe.fp8_format.forward, recipe.fp8_format.forward, recipe.fp8_format.backward]
        state = self.fp8_state
        if self.training:
            state.update(recipe, kinds, fp8.get_fp8_group())
        dtypes = tuple(fp8.fp8_dtype(kind) for kind in kinds)
        out, input_amax, weight_amax = _Fp8Linear.apply(
            input, weight, self.bias, state.scale, state.scale_inv, state.amax_history, dtypes, self.training
        )
        if self.training:
            state.record(_INPUT, input_amax)
            state.record(_WEIGHT, weight_amax)
        return out

    def get_extra_state(self) -> dict[str, Any]:
        return self.fp8_state.state_dict()

    def set_extra_state(self, state: Any) -> None:
        if state is not None:
            self.fp8_state.load_state_dict(state)

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> "Linear":
        super()._apply(fn, *args, **kwargs)
        # the scaling state follows the parameters to their device
        if self.weight is not None:
            self.fp8_state.to(self.weight.device)
        return self

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class _Fp8Linear(torch.autograd.Function):
    """The fp8 GEMMs of forward and backward. The forward returns the amaxes of input and weight for the module to
    record; the backward records the gradient's amax itself, into the live ``amax_history`` (a tensor the module's
    forward never hands over otherwise)."""

    @staticmethod
    def forward(
        ctx: Any,
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: Optional[torch.Tensor],
        scale: torch.Tensor,
        scale_inv: torch.Tensor,
        amax_history: torch.Tensor,
        dtypes: tuple[torch.dtype, ...],
        record: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cast = torch.ops.hpu.cast_to_fp8_v2
        x, input_amax = cast(input.reshape(-1, input.shape[-1]), scale[_INPUT], False, record, dtypes[_INPUT])
        w, weight_amax = cast(weight, scale[_WEIGHT], False, record, dtypes[_WEIGHT])
        # the scales of this step's operands; the live ones change at the next update
        forward_scale_inv = scale_inv[:_GRAD_OUTPUT].clone()
        out = torch.ops.hpu.fp8_gemm_v2(
            x, False, w, True, None, torch.bfloat16, forward_scale_inv[_INPUT], forward_scale_inv[_WEIGHT], bias, False
        )
        ctx.save_for_backward(x, w, forward_scale_inv)
        # the gradient is cast with the scale current at backward time, as Transformer Engine does
        ctx.scale, ctx.scale_inv, ctx.amax_history = scale, scale_inv, amax_history
        ctx.dtype, ctx.record = dtypes[_GRAD_OUTPUT], record
        ctx.shapes = (input.shape, input.dtype, weight.dtype, bias is not None)
        ctx.mark_non_differentiable(input_amax, weight_amax)
        return out.reshape(*input.shape[:-1], out.shape[-1]), input_amax, weight_amax

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor, *_: Any) -> tuple[Optional[torch.Tensor], ...]:
        x, w, forward_scale_inv = ctx.saved_tensors
        input_shape, input_dtype, weight_dtype, has_bias = ctx.shapes
        grad = grad_output.reshape(-1, grad_output.shape[-1])
        g, amax = torch.ops.hpu.cast_to_fp8_v2(grad, ctx.scale[_GRAD_OUTPUT], False, ctx.record, ctx.dtype)
        if ctx.record:
            fp8.record_amax(ctx.amax_history, _GRAD_OUTPUT, amax)
        grad_scale_inv = ctx.scale_inv[_GRAD_OUTPUT]
        grad_input = torch.ops.hpu.fp8_gemm_v2(
            g, False, w, False, None, torch.bfloat16, grad_scale_inv, forward_scale_inv[_WEIGHT], None, False
        )
        grad_weight = torch.ops.hpu.fp8_gemm_v2(
            g, True, x, False, None, torch.float32, grad_scale_inv, forward_scale_inv[_INPUT], None, False
        )
        grad_bias = grad.float().sum(0) if has_bias else None
        return (
            grad_input.reshape(input_shape).to(input_dtype),
            grad_weight.to(weight_dtype),
            None if grad_bias is None else grad_bias.to(weight_dtype),
            None,
            None,
            None,
            None,
            None,
        )
