"""Adagrad with learning-rate decay and L2 weight decay, as ``torch.optim.Adagrad``."""

from typing import Callable, Iterable, Optional

import torch
from torch.optim import Optimizer

from habana_frameworks.torch.core import step_closure


class FusedAdagrad(Optimizer):
    """Gaudi's fused Adagrad: each step equals ``torch.optim.Adagrad`` with the same arguments. The accumulators
    (``state["sum"]``) are created with the optimizer, as on Gaudi, and the step count is kept per group
    (``group["step"]``); the learning rate is read from the group at each step, so LR schedulers apply."""

    def __init__(
        self,
        params: Iterable[torch.nn.parameter.Parameter],
        lr: float = 1e-2,
        lr_decay: float = 0,
        weight_decay: float = 0,
        initial_accumulator_value: float = 0,
        eps: float = 1e-10,
    ) -> None:
        arguments = dict(
            lr=lr, lr_decay=lr_decay, weight_decay=weight_decay, initial_accumulator_value=initial_accumulator_value
        )
        for name, value in (*arguments.items(), ("eps", eps)):
            if value < 0.0:
                raise ValueError(f"Invalid {name} value: {value}. It must be >= 0.")
        super().__init__(params, dict(arguments, eps=eps))
        for group in self.param_groups:
            for param in group["params"]:
                self.state[param]["sum"] = torch.full_like(param, group["initial_accumulator_value"])
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
            group["step"] = group.get("step", 0) + 1
            lr = group["lr"] / (1 + (group["step"] - 1) * group["lr_decay"])
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise RuntimeError("FusedAdagrad does not support sparse gradients; use torch.optim.Adagrad.")
                grad = param.grad
                if group["weight_decay"] != 0:
                    grad = grad.add(param, alpha=group["weight_decay"])
                accumulator = self.state[param]["sum"]
                accumulator.addcmul_(grad, grad, value=1)
                param.addcdiv_(grad, accumulator.sqrt().add_(group["eps"]), value=-lr)
        return loss
