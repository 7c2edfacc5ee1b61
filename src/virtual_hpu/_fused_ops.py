"""``torch.ops.hpu`` kernels that integrations call directly; registered when the facade is imported.

``optimizer_adamw`` is the fused AdamW step DeepSpeed's ``FusedAdam`` calls on HPU (``op_builder/hpu``): the caller
folds learning rate and bias corrections into ``neg_step_t`` (``-lr * sqrt(1 - beta2**t) / (1 - beta1**t)``) and
decoupled weight decay into ``weight_decay`` (``1 - lr * wd``, a float in lazy mode, a tensor in eager mode); Gaudi's
``hpex.optimizers.FusedAdamW`` calls it too, once per parameter group. Only a CPU kernel is registered: hpu tensors
reach it through the virtual Gaudi's fallback, one device op for all the group's tensors, as on Gaudi.
"""

from typing import Union

import torch

_library = torch.library.Library("hpu", "DEF")
_ARGS = (
    "Tensor[] gradient_vec, Tensor(a!)[] weight_vec, Tensor(b!)[] exp_avg_vec, Tensor(c!)[] exp_avg_sq_vec, "
    "Tensor neg_step_t, float beta1, float beta2, float epsilon"
)
_library.define(f"optimizer_adamw({_ARGS}, float weight_decay, bool has_weight_decay=True) -> ()")
_library.define(f"optimizer_adamw.wd_tensor({_ARGS}, Tensor weight_decay, bool has_weight_decay=True) -> ()")


@torch.no_grad()
def _optimizer_adamw(
    grads: list[torch.Tensor],
    weights: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    neg_step: torch.Tensor,
    beta1: float,
    beta2: float,
    epsilon: float,
    weight_decay: Union[float, torch.Tensor],
    has_weight_decay: bool = True,
) -> None:
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    if has_weight_decay:
        # Callers pass one-element tensors; foreach ops want 0-dim ones.
        factor = weight_decay.reshape(()) if isinstance(weight_decay, torch.Tensor) else weight_decay
        torch._foreach_mul_(weights, factor)
    denominators = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denominators, epsilon)
    updates = torch._foreach_div(exp_avgs, denominators)
    torch._foreach_mul_(updates, neg_step.reshape(()))
    torch._foreach_add_(weights, updates)


def _optimizer_adamw_fake(*args: object, **kwargs: object) -> None:
    return None


for _overload in ("optimizer_adamw", "optimizer_adamw.wd_tensor"):
    _library.impl(_overload, _optimizer_adamw, "CPU")
    torch.library.register_fake(f"hpu::{_overload}", _optimizer_adamw_fake, lib=_library)
