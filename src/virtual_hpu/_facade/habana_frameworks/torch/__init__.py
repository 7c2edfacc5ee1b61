"""Bridge entry point: importing it makes ``hpu`` usable from torch, as importing the real bridge does."""

import torch
import torch._tensor_str

import virtual_hpu

# the bridge's own check when it loads, before anything of it is imported: lazy mode on an image with stock PyTorch
virtual_hpu.check_bridge_loads()

from habana_frameworks.torch import core, hpu, utils  # noqa: E402, F401
from habana_frameworks.torch.distributed import hccl  # noqa: E402, F401  (as the bridge: "hccl" registered, ranks read)

# importing _clip_norm_ops, _fp8_ops and _fused_ops registers torch.ops.hpu.*
from virtual_hpu import _clip_norm_ops, _fp8_ops, _fused_ops, _rnn_cell_ops, _sync_batch_norm_ops, is_privateuse1  # noqa: E402, F401

torch._register_device_module("hpu", hpu)
# the device's dispatch key (see virtual_hpu.is_privateuse1)
_sync_batch_norm_ops.register("PrivateUse1" if is_privateuse1() else "HPU")
if is_privateuse1():
    _rnn_cell_ops.register()


def _print_in_fp32(to_type=torch._tensor_str.tensor_totype):
    """Printing casts values to float64, which Gaudi lacks; format hpu tensors in float32, as torch does for MPS."""

    def tensor_totype(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype=torch.float) if t.device.type == "hpu" else to_type(t)

    torch._tensor_str.tensor_totype = tensor_totype


_print_in_fp32()
