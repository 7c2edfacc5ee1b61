"""A functional AdamW, stepped with the gradients passed in, as ``torch.distributed.optim``'s functional optimizers."""

from typing import Optional

import torch
from torch import Tensor

from habana_frameworks.torch.hpex.optimizers._adamw_update import (
    MomentsDtype,
    adamw_,
    in_fp8,
    init_state,
    moment_dtypes,
)
from habana_frameworks.torch.hpex.optimizers.FusedAdamW import _check_adam_arguments


class FusedAdamW:
    """Gaudi's functional fused AdamW (one parameter group, no ``Optimizer`` base), for optimizers that receive the
    gradients as arguments (``torch.distributed.optim``, DDP's optimizer overlap). ``step(gradients)`` equals a
    ``torch.optim.AdamW`` step with those gradients; ``step_param`` is not supported, as on Gaudi."""

    def __init__(
        self,
        params: list[Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        _allow_empty_param_list: bool = False,
        moments_dtype: MomentsDtype = None,
    ) -> None:
        _check_adam_arguments(lr, betas, eps)
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if len(params) == 0 and not _allow_empty_param_list:
            raise ValueError("optimizer got an empty parameter list")
        self.defaults = {"lr": lr, "eps": eps, "beta1": betas[0], "beta2": betas[1], "weight_decay": weight_decay}
        self.amsgrad = False
        self.maximize = False
        self.state: dict[Tensor, dict[str, Tensor]] = {}
        self.param_group = {"params": params}
        self.moments_dtype = moments_dtype
        self.moments_in_fp8 = in_fp8(moments_dtype)

    def step_param(self, param: Tensor, grad: Optional[Tensor]) -> None:
        raise RuntimeError("This AdamW optimizer does not support step_param(); call step(gradients) instead.")

    @torch.no_grad()
    def step(self, gradients: list[Optional[Tensor]]) -> None:
        """One AdamW step of the parameters that have a gradient in ``gradients`` (one entry per parameter)."""
        params = self.param_group["params"]
        if len(params) != len(gradients):
            raise ValueError(
                "the gradients passed in does not equal to the size of the parameters! "
                f"Params length: {len(params)}. Gradients length: {len(gradients)}"
            )
        for param, gradient in zip(params, gradients):
            if gradient is None:
                continue
            if param not in self.state:
                state = self.state[param] = {}
                init_state(state, param, self.moments_dtype)
                state["step"] = torch.tensor(0.0)
            state = self.state[param]
            state["step"] += 1
            adamw_(
                param,
                gradient,
                state,
                step=int(state["step"].item()),
                lr=self.defaults["lr"],
                beta1=self.defaults["beta1"],
                beta2=self.defaults["beta2"],
                eps=self.defaults["eps"],
                weight_decay=self.defaults["weight_decay"],
                bias_correction=True,
            )

    def get_moment_dtypes(self, param_dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
        """The dtypes of the first and second moments of a parameter of ``param_dtype``."""
        return moment_dtypes(self.moments_dtype, param_dtype)

    def check_moments_in_fp8(self) -> bool:
        """Whether a moment is kept in fp8."""
        return in_fp8(self.moments_dtype)
