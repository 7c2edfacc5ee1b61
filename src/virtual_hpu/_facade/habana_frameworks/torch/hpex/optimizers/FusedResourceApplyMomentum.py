"""Momentum that adds ready-made steps, as TensorFlow's ``ResourceApplyMomentum`` with the learning rate applied
before it (by :class:`FusedLars`)."""

from typing import Callable, Optional

import torch
from torch.optim.optimizer import Optimizer

from habana_frameworks.torch.core import step_closure


class FusedResourceApplyMomentum(Optimizer):
    """Gaudi's fused momentum update for gradients that are already scaled steps ``s`` (MLPerf ResNet wraps it in
    :class:`FusedLars`, which applies the learning rate and weight decay)::

        momentum_buffer = momentum * momentum_buffer - s
        w = w + momentum_buffer

    As on Gaudi, the step uses neither ``lr`` nor ``weight_decay`` nor ``nesterov``: they are the parameter group's
    settings for the wrapping optimizer and for LR schedulers.
    """

    def __init__(self, params, lr, momentum=0, weight_decay=0, nesterov=False) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and momentum <= 0:
            raise ValueError("Nesterov momentum requires a momentum")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov))

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)

    @torch.no_grad()
    def step(self, closure: Optional[Callable] = None) -> Optional[torch.Tensor]:
        """Performs a single optimization step; ``closure`` re-evaluates the model and returns the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            step_closure._mark_step_if_lazy()
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(param)
                buffer = state["momentum_buffer"]
                buffer.mul_(group["momentum"]).sub_(param.grad)
                param.add_(buffer)
            step_closure._mark_step_if_lazy()
        return loss
