"""The CPU reference of ``scaled_dot_product_attention`` on hpu: the backend torch takes for hpu."""

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from virtual_hpu import torch_support


def backends_as_on_hpu(device: torch.device) -> contextlib.AbstractContextManager:
    """Before torch 2.8, torch decomposes attention on the HPU device type into the math backend's ops, where CPU may
    take its flash kernel: on CPU, the math backend then, so that both compute alike."""
    if device.type == "cpu" and torch_support.installed() < torch_support.HPU_SDPA_CHOOSES_A_KERNEL:
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()
