"""The HPU tests run on the virtual Gaudi unless a real Gaudi software stack is installed.

This runs before any test module imports ``pytorch_lightning``, which activates the virtual device from the
environment; subprocesses started by the tests inherit the setting.
"""

import importlib.util
import os

if "VIRTUAL_HPU" not in os.environ and importlib.util.find_spec("habana_frameworks") is None:
    os.environ["VIRTUAL_HPU"] = "1"


import pytest
import torch
import torch.distributed


@pytest.fixture(autouse=True)
def restore_environment_and_process_group():
    """Undo what an in-process run leaves behind: Lightning's launcher writes ``MASTER_PORT``, ``LOCAL_RANK``,
    ``WORLD_SIZE`` ... into ``os.environ``, and a later subprocess would take them for an external launch; DeepSpeed's
    HPU accelerator, created when ``deepspeed`` is imported or used, turns deterministic algorithms on for the process,
    which changes the kernels later tests compare."""
    saved = dict(os.environ)
    deterministic = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    yield
    os.environ.clear()
    os.environ.update(saved)
    torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture
def amx_host():
    """The host as on AMX / AVX-512 FP16 CPUs, whose fp8 GEMM kernel refuses Gaudi2's e4m3: the virtual Gaudi's fp8
    emulation must not depend on it (in this process; tests that start processes run on this host as it is)."""
    from tests_virtual_hpu.amx_host import simulated_amx_host

    with simulated_amx_host():
        yield
