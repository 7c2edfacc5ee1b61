"""Private names of upstream Lightning and torch that the project relies on, each with where and why.

A failure here means the next upstream release renamed or reshaped one of them: re-check the file named in the
message before anything else.
"""

import inspect

import pytest
import torch
import torch.distributed as dist
from lightning.fabric import connector
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.trainer.trainer import Trainer


def _called_in(method, call: str) -> bool:
    return call in inspect.getsource(method)


def test_trainer_run():
    """``trainer/trainer.py``: our ``Trainer._run`` keeps logging eager in a compiled module, then calls upstream's."""
    assert list(inspect.signature(Trainer._run).parameters)[:2] == ["self", "model"], (
        "upstream's Trainer._run changed its signature: re-check pytorch_lightning/trainer/trainer.py"
    )


@pytest.mark.parametrize(
    ("strategy", "caller"),
    [
        (DDPStrategy, DDPStrategy.setup_distributed),
        (DeepSpeedStrategy, DeepSpeedStrategy._init_deepspeed_distributed),
        (FSDPStrategy, FSDPStrategy.setup_environment),
        (ModelParallelStrategy, ModelParallelStrategy._setup_distributed),
    ],
)
def test_process_group_backend_choice(strategy, caller):
    """``strategies/_hpu.py``: ``_HPUParallelDevicesMixin`` overrides ``_get_process_group_backend`` so that an HPU
    strategy given no backend uses "hccl" (upstream's default off CUDA is gloo)."""
    message = f"{strategy.__name__} no longer chooses its backend with _get_process_group_backend: re-check _hpu.py"
    assert callable(strategy._get_process_group_backend), message
    assert _called_in(caller, "self._get_process_group_backend()"), message


def test_precision_flag_normalisation():
    """``plugins/precision/hpu.py``: precision flags become upstream's unified strings (``16`` -> ``"16-mixed"``)."""
    assert connector._convert_precision_to_unified_args("bf16") == "bf16-mixed", (
        "lightning.fabric.connector._convert_precision_to_unified_args changed: re-check plugins/precision/hpu.py"
    )


def test_gloo_options_the_virtual_hccl_copies():
    """``virtual_hpu/hccl.py``: groups split from an "hccl" group start from a copy of gloo's backend options, made
    from these fields."""
    options = dist.ProcessGroupGloo._Options()
    for field in ("_timeout", "_threads", "_devices", "global_ranks_in_group", "group_name"):
        assert hasattr(options, field), f"ProcessGroupGloo._Options has no {field}: re-check virtual_hpu/hccl.py"


def test_the_host_fp8_gemm_the_amx_simulation_overrides():
    """``tests_virtual_hpu/amx_host.py``: the simulation of an AMX host replaces the CPU kernel of
    ``aten::_scaled_mm`` (what the virtual Gaudi must never depend on) and restores it with ``Library._destroy``."""
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::_scaled_mm", "CPU"), (
        "aten::_scaled_mm has no CPU kernel any more: re-check tests_virtual_hpu/amx_host.py"
    )
    assert callable(torch.library.Library._destroy), "torch.library.Library._destroy is gone: re-check amx_host.py"
