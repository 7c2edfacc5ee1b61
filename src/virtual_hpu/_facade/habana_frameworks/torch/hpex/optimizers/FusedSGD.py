"""SGD with momentum, dampening, Nesterov and L2 weight decay, as ``torch.optim.SGD``."""

from typing import Callable, Iterable, Optional

import torch
from torch.optim.optimizer import Optimizer, required

from habana_frameworks.torch.core import step_closure


class FusedSGD(Optimizer):
    """Gaudi's fused SGD: each step equals ``torch.optim.SGD`` with the same arguments (the momentum buffer starts as
    the first gradient, as torch's does, and is kept under the same state key)."""

    def __init__(
        self,
        params: Iterable[torch.nn.parameter.Parameter],
        lr: float = required,
        momentum: float = 0,
        weight_decay: float = 0,
        dampening: float = 0,
        nesterov: bool = False,
    ) -> None:
        if lr is required:
            raise ValueError("FusedSGD needs a learning rate: pass `lr`, e.g. `FusedSGD(params, lr=0.1)`.")
        for name, value in (("learning rate", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            if value < 0.0:
                raise ValueError(f"Invalid {name} value: {value}. It must be >= 0.")
        if dampening < 0.0:
            raise ValueError(f"Invalid dampening value: {dampening}. It must be >= 0.")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, dampening=dampening, nesterov=nesterov)
        super().__init__(params, defaults)
        step_closure._mark_step_if_lazy()

    @torch.no_grad()
    def step(self, closure: Optional[Callable] = None) -> Optional[torch.Tensor]:
        """Performs a single optimization step; ``closure`` re-evaluates the model and returns the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            step_closure._mark_step_if_lazy()
            momentum, dampening, weight_decay = group["momentum"], group["dampening"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise RuntimeError("FusedSGD does not support sparse gradients; use torch.optim.SGD for them.")
                update = param.grad if weight_decay == 0 else param.grad.add(param, alpha=weight_decay)
                if momentum != 0:
                    state = self.state[param]
                    buffer = state.get("momentum_buffer")
                    if buffer is None:
                        buffer = state["momentum_buffer"] = update.clone()
                    else:
                        buffer.mul_(momentum).add_(update, alpha=1 - dampening)
                    update = update.add(buffer, alpha=momentum) if group["nesterov"] else buffer
                param.add_(update, alpha=-group["lr"])
            step_closure._mark_step_if_lazy()
        return loss
