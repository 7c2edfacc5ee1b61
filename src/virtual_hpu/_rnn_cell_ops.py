"""aten's fused LSTM and GRU cells, which torch's recurrent layers call on a PrivateUse1 device (hpu on PyPI's builds).

torch's LSTM and GRU take these fused cells for CUDA, XPU and PrivateUse1 inputs (torch 2.9 to 2.11 at least), with
kernels on GPUs only: the device's fallback to CPU kernels cannot run them. Composed here of the elementwise ops the
cells fuse, registered for PrivateUse1 and its autograd key, so that autograd differentiates the composition and the
fused backward ops are never asked for. Registered when the facade is imported, where the device is PrivateUse1.
"""

from typing import Optional

import torch
from torch import Tensor

_library = torch.library.Library("aten", "IMPL")


def _gates(input_gates: Tensor, hidden_gates: Tensor, input_bias: Optional[Tensor], hidden_bias: Optional[Tensor]):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias
    if hidden_bias is not None:
        gates = gates + hidden_bias
    return gates


def _lstm_cell(
    input_gates: Tensor,
    hidden_gates: Tensor,
    cx: Tensor,
    input_bias: Optional[Tensor] = None,
    hidden_bias: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    gates = _gates(input_gates, hidden_gates, input_bias, hidden_bias)
    ingate, forgetgate, cellgate, outgate = gates.chunk(4, 1)
    cy = forgetgate.sigmoid() * cx + ingate.sigmoid() * cellgate.tanh()
    hy = outgate.sigmoid() * cy.tanh()
    # the workspace (the second result of the GRU cell too) feeds only the fused backward op, never reached here
    return hy, cy, gates


def _gru_cell(
    input_gates: Tensor,
    hidden_gates: Tensor,
    hx: Tensor,
    input_bias: Optional[Tensor] = None,
    hidden_bias: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    # the new gate adds the hidden bias inside the reset gate's product, so the two sides stay apart
    if input_bias is not None:
        input_gates = input_gates + input_bias
    if hidden_bias is not None:
        hidden_gates = hidden_gates + hidden_bias
    input_reset, input_update, input_new = input_gates.chunk(3, 1)
    hidden_reset, hidden_update, hidden_new = hidden_gates.chunk(3, 1)
    resetgate = (input_reset + hidden_reset).sigmoid()
    updategate = (input_update + hidden_update).sigmoid()
    newgate = (input_new + resetgate * hidden_new).tanh()
    hy = newgate + updategate * (hx - newgate)
    return hy, input_gates


def register() -> None:
    """Register the cells for PrivateUse1, below autograd and at its autograd key."""
    for key in ("PrivateUse1", "AutogradPrivateUse1"):
        _library.impl("_thnn_fused_lstm_cell", _lstm_cell, key)
        _library.impl("_thnn_fused_gru_cell", _gru_cell, key)
