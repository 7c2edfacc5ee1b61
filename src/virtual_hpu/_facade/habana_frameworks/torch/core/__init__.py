"""``habana_frameworks.torch.core`` (htcore): graph cuts in lazy mode and module preparation."""

from typing import Any

from habana_frameworks.torch import hpu  # noqa: F401  (``core.hpu.Event`` and friends, as on the real stack)
from habana_frameworks.torch.core.step_closure import add_step_closure, iter_mark_step, mark_step  # noqa: F401
from habana_frameworks.torch.utils.internal import is_lazy  # noqa: F401

# Gaudi's inference mode (for models prepared for inference, e.g. quantized ones; the bridge keeps it in its library,
# newer ones answer ``hpu.is_inference_mode_enabled()``), and whether ``hpu_set_env`` was
# called since the process started: ``hpu_initialize`` switches the mode on only if it was not, as the bridge does
_inference_mode = False
_set_env_called = False


def hpu_set_env(model: Any = None) -> Any:
    """Switch Gaudi's inference mode on (the bridge's older name of ``hpu_set_inference_env``); with a model, return
    it with convolutions and batch norms fused, which the virtual device needs not do.

    It reads no environment: the autocast op lists are read once, when the device is activated
    (``PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST``, ``PT_HPU_AUTOCAST_FP32_OPS_LIST``)."""
    global _inference_mode, _set_env_called
    _inference_mode, _set_env_called = True, True
    return model


hpu_set_inference_env = hpu_set_env


def hpu_reset_env() -> None:
    """Switch Gaudi's inference mode off."""
    global _inference_mode
    _inference_mode = False


hpu_teardown_inference_env = hpu_reset_env


def hpu_initialize(
    model: Any = None, mark_only_scales_as_const: bool = False, optimizer: Any = None, args: Any = None
) -> None:
    """Prepare a (quantized) model on the device for inference: the bridge marks its weights (or only its scales) as
    constants and switches inference mode on unless ``hpu_set_env`` was called before; the virtual device has no
    constants to mark."""
    global _inference_mode
    if not _set_env_called:
        _inference_mode = True


hpu_inference_initialize = hpu_initialize

# as on the real stack, importing core registers torch.compile's "hpu_backend"
from habana_frameworks.torch.dynamo import compile_backend  # noqa: E402, F401
