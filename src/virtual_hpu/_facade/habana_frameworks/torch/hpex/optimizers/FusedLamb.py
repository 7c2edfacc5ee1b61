"""LAMB (You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes")."""

from typing import Callable, Optional

import torch
from torch.optim import Optimizer

from habana_frameworks.torch.core import step_closure


class FusedLamb(Optimizer):
    """Gaudi's fused LAMB. A step, as the bridge's kernels compute it:

    1. all gradients are divided by ``norm / max_grad_norm`` when their global L2 norm exceeds ``max_grad_norm``
       (``None``: no clipping);
    2. per parameter, Adam moments ``m = beta1 m + (1 - beta1) g`` (``+ g`` without ``grad_averaging``),
       ``v = beta2 v + (1 - beta2) g²``, and the update ``u = m̂ / (sqrt(v̂) + eps) + weight_decay * w`` with the
       bias-corrected ``m̂``, ``v̂`` (uncorrected without ``bias_correction``);
    3. ``w -= lr * r * u`` with the trust ratio ``r = ‖w‖ / ‖u‖`` (1 when ``‖u‖`` is 0) in groups with weight decay,
       or in all groups with ``use_lamb=True``; ``r = 1`` otherwise.

    Weight decay is always decoupled (``adam_w_mode`` is kept for compatibility, as on Gaudi); AMSGrad is not
    supported. ``zero_grad`` sets gradients to ``None`` unless ``set_grad_none=False``. ``dtype`` is the type the
    global gradient norm is computed in.
    """

    def __init__(
        self,
        params,
        lr=1e-3,
        bias_correction=True,
        betas=(0.9, 0.999),
        eps=1e-6,
        weight_decay=0.01,
        amsgrad=False,
        adam_w_mode=True,
        grad_averaging=True,
        set_grad_none=True,
        max_grad_norm=1.0,
        use_lamb=False,
        fused=False,
        dtype=None,
    ) -> None:
        if amsgrad:
            raise RuntimeError("FusedLamb does not support the AMSGrad variant; pass `amsgrad=False`.")
        defaults = dict(
            lr=lr,
            bias_correction=bias_correction,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            grad_averaging=grad_averaging,
            max_grad_norm=max_grad_norm,
        )
        super().__init__(params, defaults)
        self.fused = fused
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.set_grad_none = set_grad_none
        self.use_lamb = use_lamb
        self.device = self.param_groups[0]["params"][0].device
        self.dtype = dtype

    def zero_grad(self) -> None:
        super().zero_grad(set_to_none=self.set_grad_none)

    @torch.no_grad()
    def step(self, closure: Optional[Callable] = None) -> Optional[torch.Tensor]:
        """Performs a single optimization step; ``closure`` re-evaluates the model and returns the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        clip = self._clip_divisor()
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
            beta1, beta2 = group["betas"]
            bias_correction1 = 1 - beta1 ** group["step"] if group["bias_correction"] else 1.0
            bias_correction2 = 1 - beta2 ** group["step"] if group["bias_correction"] else 1.0
            weight_decay = group["weight_decay"]
            step_closure._mark_step_if_lazy()
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                grad = param.grad / clip.to(param.grad.dtype)
                state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1 if group["grad_averaging"] else 1.0)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                update = (state["exp_avg"] / bias_correction1) / (
                    (state["exp_avg_sq"] / bias_correction2).sqrt() + group["eps"]
                )
                if weight_decay != 0:
                    update.add_(param, alpha=weight_decay)
                if weight_decay != 0 or self.use_lamb:
                    update_norm = torch.linalg.vector_norm(update)
                    trust_ratio = torch.where(update_norm > 0, torch.linalg.vector_norm(param) / update_norm, 1.0)
                    update.mul_(trust_ratio.to(update.dtype))
                param.add_(update, alpha=-group["lr"])
            step_closure._mark_step_if_lazy()
        return loss

    def _clip_divisor(self) -> torch.Tensor:
        """What the gradients are divided by: their global L2 norm over ``max_grad_norm`` if above it, else 1."""
        max_grad_norm = self.defaults["max_grad_norm"]
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        if max_grad_norm is None or not grads:
            return torch.ones((), device=self.device)
        for grad in grads:
            if grad.is_sparse:
                raise RuntimeError("FusedLamb does not support sparse gradients; use torch.optim.SparseAdam.")
        norms = [torch.linalg.vector_norm(grad if self.dtype is None else grad.to(self.dtype)) for grad in grads]
        global_norm = torch.linalg.vector_norm(torch.stack(norms).float())
        return torch.where(global_norm > max_grad_norm, global_norm / max_grad_norm, 1.0)
