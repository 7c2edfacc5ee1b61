"""``habana_frameworks.torch.core`` (htcore): graph cuts in lazy mode and module preparation."""

import os
from typing import Any

import torch

from habana_frameworks.torch import hpu  # noqa: F401  (``core.hpu.Event`` and friends, as on the real stack)


def is_lazy() -> bool:
    """Whether lazy mode is on (``PT_HPU_LAZY_MODE``, default 0), as read at activation."""
    import virtual_hpu

    return virtual_hpu.config().lazy


def mark_step(device_str: str = "", sync: bool = False) -> None:
    """Cut the pending lazy graph. The virtual device runs ops eagerly, so this only counts the cut;
    in eager mode it is a no-op, as on Gaudi."""
    if is_lazy():
        torch.ops.virtual_hpu.mark_step()


def hpu_set_env() -> None:
    """Apply the run environment: the lazy-mode flag, and the autocast op lists named by ``LOWER_LIST`` /
    ``FP32_LIST`` (integrations set those variables, then call this, before the first autocast region)."""
    from virtual_hpu import autocast

    os.environ.setdefault("PT_HPU_LAZY_MODE", "1" if is_lazy() else "0")
    autocast.set_op_lists_from_env()


def hpu_initialize(model: Any = None, mark_only_scales_as_const: bool = True, **kwargs: Any) -> None:
    """Prepare a (quantized) model for inference on Gaudi; on the virtual device there is nothing to prepare."""


# the real ``core`` imports it, so ``htcore.step_closure._mark_step_if_lazy`` works after ``import ...core``
from habana_frameworks.torch.core import step_closure  # noqa: E402, F401

# as on the real stack, importing core registers torch.compile's "hpu_backend"
from habana_frameworks.torch.dynamo import compile_backend  # noqa: E402, F401
