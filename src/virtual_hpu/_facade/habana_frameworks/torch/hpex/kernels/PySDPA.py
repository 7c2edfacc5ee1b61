"""``PySDPA`` and ``PySDPAHinted``: the bridge's attention written in Python ops (sliced or not), without a mask."""

import torch

from habana_frameworks.torch.hpex.kernels.FusedSDPA import FusedSDPA


class PySDPA:
    """``PySDPA.apply(q, k, v, is_causal=False, with_slice=False)``: attention without mask or dropout.

    ``with_slice`` splits the work into slices on a Gaudi to bound memory; the result is the same.
    """

    @staticmethod
    def apply(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, with_slice: bool = False):
        return FusedSDPA.apply(q, k, v, None, 0.0, is_causal)


class PySDPAHinted(PySDPA):
    """``PySDPA`` whose graph carries hints for Gaudi's graph compiler; the same attention (sliced by default)."""

    @staticmethod
    def apply(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, with_slice: bool = True):
        return FusedSDPA.apply(q, k, v, None, 0.0, is_causal)
