"""The host CPU as the virtual Gaudi meets it on AMX / AVX-512 FP16 machines (current Xeons), for tests on any host.

There torch's host fp8 GEMM, ``aten::_scaled_mm`` (oneDNN), refuses ``float8_e4m3fnuz`` operands, the dtype of
Gaudi2's e4m3. Use ``with simulated_amx_host(): ...`` around code that must not depend on that kernel.
"""

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

ONEDNN_ERROR = "itensor_view_from_dense expects float/bfloat16/half/int8/fp8 tensor input"


@contextmanager
def simulated_amx_host() -> Iterator[None]:
    """Within the block, the host kernel of ``aten::_scaled_mm`` raises oneDNN's error, whoever calls it (Python, or
    the dispatcher on behalf of another device); stricter than an AMX host, which refuses Gaudi2's e4m3 only."""

    def refuse(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError(ONEDNN_ERROR)

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that the kernel it had is overridden: that is the point
        library.impl("_scaled_mm", refuse, "CPU")
    try:
        yield
    finally:
        library._destroy()
