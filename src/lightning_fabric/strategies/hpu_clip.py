"""Gradient clipping by the total norm on HPUs with Gaudi's fused clip-norm."""

from collections.abc import Iterable
from functools import cached_property
from typing import Any, Union

import torch
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer


class HPUGradientClipper:
    """Clips gradients by their total L2 norm with Gaudi's fused clip-norm (``hpex.normalization.FusedClipNorm``): one
    device op for all gradients, where ``torch.nn.utils.clip_grad_norm_`` launches a norm and a multiplication per
    gradient (Intel's guide lists it among the fused ops that cut host overhead).

    The fused op computes torch's result (per-gradient norms, their norm, ``max_norm / (total + 1e-6)`` clamped to 1)
    for the norm type 2 on gradients that are plain HPU tensors of one dtype; any other call (another norm type,
    sharded ``DTensor`` gradients, several dtypes, another device) goes to ``torch.nn.utils.clip_grad_norm_``.
    Used by the Trainer's HPU precision plugins for ``gradient_clip_val`` and by Fabric's single-device and
    data-parallel HPU strategies for ``fabric.clip_gradients``. It keeps one ``FusedClipNorm`` (the limit as a device
    tensor) per limit and dtype.
    """

    def __init__(self) -> None:
        self._fused: dict[tuple[float, torch.dtype], Any] = {}

    @staticmethod
    def fuses(gradients: list[Tensor], norm_type: Union[float, int, str]) -> bool:
        """Whether the fused op gives torch's result for these gradients and norm type."""
        if not gradients or norm_type not in (2, 2.0):
            return False
        dtype = gradients[0].dtype
        # a subclass (DTensor's shards) holds part of a gradient: its norm needs a collective the fused op lacks
        return all(
            type(g) is Tensor and g.device.type == "hpu" and g.layout == torch.strided and g.dtype == dtype
            for g in gradients
        )

    def clip_grad_norm_(
        self,
        parameters: Iterable[Tensor],
        max_norm: Union[float, int],
        norm_type: Union[float, int, str] = 2.0,
        error_if_nonfinite: bool = False,
    ) -> Tensor:
        """Scale the gradients of ``parameters`` in place so that their total norm is at most ``max_norm``, and return
        that norm before scaling (a 0-dim tensor), as ``torch.nn.utils.clip_grad_norm_`` does.

        With ``error_if_nonfinite`` a non-finite norm raises, as in torch, after reading the norm on the host; on the
        fused path the gradients, which hold inf or NaN values then, have been scaled by it already.
        """
        parameters = [parameters] if isinstance(parameters, Tensor) else list(parameters)
        gradients = [p.grad for p in parameters if p.grad is not None]
        if not self.fuses(gradients, norm_type):
            return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite)
        total = self._fused_clip_norm(float(max_norm), gradients[0]).clip_norm(parameters).reshape(())
        if error_if_nonfinite and not torch.isfinite(total):
            raise RuntimeError(
                f"The total norm of the gradients (order {norm_type}) is {total.item()}: some gradients are inf or NaN"
                " and were scaled by it in Gaudi's fused clip-norm. Find where they come from (a learning rate too"
                " high, an fp16 overflow), or pass `error_if_nonfinite=False` to clip without this check."
            )
        return total

    def _fused_clip_norm(self, max_norm: float, gradient: Tensor) -> Any:
        from habana_frameworks.torch.hpex.normalization import FusedClipNorm

        key = (max_norm, gradient.dtype)
        if key not in self._fused:
            # the bridge takes the dtype of its limit and of the returned norm from the first tensor given
            self._fused[key] = FusedClipNorm([gradient], max_norm)
        return self._fused[key]


class _FusedClipNormMixin:
    """For Fabric's HPU strategies whose processes hold whole gradients (one HPU, data parallel):
    ``fabric.clip_gradients(module, optimizer, max_norm=...)`` clips them with :class:`HPUGradientClipper`."""

    precision: Any

    @cached_property
    def _gradient_clipper(self) -> HPUGradientClipper:
        return HPUGradientClipper()

    def clip_gradients_norm(
        self,
        module: Module,
        optimizer: Optimizer,
        max_norm: Union[float, int],
        norm_type: Union[float, int] = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor:
        self.precision.unscale_gradients(optimizer)
        parameters = self.precision.main_params(optimizer)
        return self._gradient_clipper.clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite)
