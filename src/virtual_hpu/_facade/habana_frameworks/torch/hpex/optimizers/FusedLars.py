"""LARS (You et al., "Large Batch Training of Convolutional Networks"): layer-wise learning rates around another
optimizer."""

from typing import Any, Optional

import torch
from torch.optim.optimizer import Optimizer

from habana_frameworks.torch.core import step_closure


class FusedLars(Optimizer):
    """Gaudi's fused LARS, a wrapper that turns each gradient ``g`` of the wrapped ``optimizer``'s parameters into its
    layer-wise scaled step before the wrapped optimizer's own ``step`` runs:

    * where ``skip_mask[i]`` (the i-th parameter of its group) is true: ``lr * r * (g + weight_decay * w)`` with the
      trust ratio ``r = eeta * ‖w‖ / (‖g‖ + weight_decay * ‖w‖ + eps)`` (1 when ``‖w‖`` or ``‖g‖`` is 0);
    * elsewhere (biases, norms): ``lr * g``.

    The learning rate and weight decay are applied here, so the wrapped optimizer is one that adds the scaled step as
    it is, such as :class:`FusedResourceApplyMomentum` (MLPerf ResNet's pairing); its weight decay is set to 0 while
    it steps. The wrapper shares the wrapped optimizer's parameter groups and state, so LR schedulers and checkpoints
    of either see the same values.
    """

    def __init__(self, optimizer: Optimizer, skip_mask: list, eeta: float = 0.001, eps: float = 1e-8) -> None:
        self.optim = optimizer
        self.eeta = eeta
        self.eps = eps
        self.skip_mask = skip_mask
        defaults = optimizer.defaults
        defaults.update(dict(skip_mask=skip_mask, eeta=eeta, eps=eps))
        super().__init__(optimizer.param_groups, defaults)
        self._share_the_wrapped_optimizers_groups_and_state()

    def _share_the_wrapped_optimizers_groups_and_state(self) -> None:
        self.param_groups = self.optim.param_groups
        self.state = self.optim.state

    def zero_grad(self, set_to_none: bool = False) -> None:
        self.optim.zero_grad(set_to_none)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # loaded into the wrapped optimizer, which the wrapper keeps sharing
        self.optim.load_state_dict(state_dict)
        self._share_the_wrapped_optimizers_groups_and_state()

    def step(self, closure: Optional[Any] = None) -> Optional[torch.Tensor]:
        """Scale the gradients layer-wise, then step the wrapped optimizer."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        weight_decays = []
        with torch.no_grad():
            for group in self.optim.param_groups:
                weight_decay = group.get("weight_decay", 0)
                weight_decays.append(weight_decay)
                group["weight_decay"] = 0
                step_closure._mark_step_if_lazy()
                for index, param in enumerate(group["params"]):
                    if param.grad is not None:
                        self._scale_(param, param.grad, self.skip_mask[index], weight_decay, group["lr"])
                step_closure._mark_step_if_lazy()
        try:
            self.optim.step()
        finally:
            for group, weight_decay in zip(self.optim.param_groups, weight_decays):
                group["weight_decay"] = weight_decay
        return loss

    def _scale_(self, param: torch.Tensor, grad: torch.Tensor, lars: Any, weight_decay: float, lr: float) -> None:
        if not lars:
            grad.mul_(lr)
            return
        param_norm = torch.linalg.vector_norm(param)
        grad_norm = torch.linalg.vector_norm(grad)
        ratio = self.eeta * param_norm / (grad_norm + weight_decay * param_norm + self.eps)
        trust_ratio = torch.where((param_norm > 0) & (grad_norm > 0), ratio, 1.0)
        grad.add_(param, alpha=weight_decay).mul_((trust_ratio * lr).to(grad.dtype))
