"""The HPU tests run on the virtual Gaudi unless a real Gaudi software stack is installed.

This runs before any test module imports ``pytorch_lightning``, which activates the virtual device from the
environment; subprocesses started by the tests inherit the setting.
"""

import importlib.util
import os

if "VIRTUAL_HPU" not in os.environ and importlib.util.find_spec("habana_frameworks") is None:
    os.environ["VIRTUAL_HPU"] = "1"


import pytest
import torch  # noqa: F401  (activates the device as set above: some test modules import habana_frameworks first)


@pytest.fixture
def amx_host():
    """The host as on AMX / AVX-512 FP16 CPUs, whose fp8 GEMM kernel refuses Gaudi2's e4m3: the virtual Gaudi's fp8
    emulation must not depend on it (in this process; tests that start processes run on this host as it is)."""
    from tests_virtual_hpu.amx_host import simulated_amx_host

    with simulated_amx_host():
        yield
