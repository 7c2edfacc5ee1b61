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


def test_fabric_builds_the_connector_named_in_its_module():
    """``_lightning_hpu``: Fabric resolves HPU flags because its module's name ``_Connector`` is made to refer to
    ``HPUConnector``, a subclass of upstream's connector taking the same arguments."""
    import lightning.fabric.fabric as fabric_module

    from _lightning_hpu.connector import HPUConnector

    message = "Fabric no longer builds `_Connector(...)` from its module: re-check src/_lightning_hpu"
    assert _called_in(fabric_module.Fabric.__init__, "self._connector = _Connector("), message
    upstream = HPUConnector.__base__
    assert (upstream.__module__, upstream.__name__) == ("lightning.fabric.connector", "_Connector"), message
    assert inspect.signature(HPUConnector.__init__) == inspect.signature(upstream.__init__), message


@pytest.mark.parametrize(
    ("caller", "call"),
    [
        ("DDPStrategy._setup_distributed", "self._get_process_group_backend()"),
        ("DeepSpeedStrategy._init_deepspeed_distributed", "self._get_process_group_backend()"),
        ("DDPStrategy.setup_module", "self._determine_ddp_device_ids()"),
        ("DDPStrategy.setup_environment", "self._setup_distributed()"),
        ("DeepSpeedStrategy.setup_environment", "isinstance(self.accelerator, CUDAAccelerator)"),
        ("DeepSpeedStrategy._setup_distributed", "self._format_config()"),
    ],
)
def test_fabric_strategy_hooks(caller, call):
    """``lightning_fabric/strategies``: the HPU strategies override these private hooks of upstream's Fabric strategies
    (the backend, DDP's device ids, DeepSpeed's config), and skip DeepSpeed's ``setup_environment``, which refuses
    anything but CUDA, for the rest of its chain."""
    from lightning.fabric import strategies

    class_name, method = caller.split(".")
    assert _called_in(getattr(getattr(strategies, class_name), method), call), (
        f"upstream's Fabric {caller} no longer calls {call}: re-check lightning_fabric/strategies"
    )


def test_fabric_precision_hooks():
    """``lightning_fabric/plugins/precision/hpu.py``: the Fabric HPU plugins take Fabric's own backward and step."""
    from lightning.fabric.plugins.precision import DeepSpeedPrecision, Precision

    for hook, parameters in (("backward", ["self", "tensor", "model"]), ("optimizer_step", ["self", "optimizer"])):
        for plugin in (Precision, DeepSpeedPrecision):
            assert list(inspect.signature(getattr(plugin, hook)).parameters)[: len(parameters)] == parameters, (
                f"Fabric's {plugin.__name__}.{hook} changed: re-check lightning_fabric/plugins/precision/hpu.py"
            )


@pytest.mark.parametrize(
    ("caller", "call"),
    [
        ("_initialize_deepspeed_train", "self._init_optimizers()"),
        ("_format_batch_size_and_grad_accum_config", "self._auto_select_batch_size()"),
        ("_auto_select_batch_size", "fit_loop._data_source"),
        ("_initialize_deepspeed_inference", "deepspeed.initialize("),
    ],
)
def test_trainer_deepspeed_hooks(caller, call):
    """``strategies/hpu_deepspeed.py``: the HPU strategy refuses a missing optimizer in ``_init_optimizers`` (upstream
    hands DeepSpeed a ``_MockOptimizer``), keeps evaluation away from the training data in ``_auto_select_batch_size``,
    and builds DeepSpeed's inference engine in ``_initialize_deepspeed_inference``."""
    from lightning.pytorch.core.optimizer import _MockOptimizer

    assert _called_in(getattr(DeepSpeedStrategy, caller), call), (
        f"upstream's DeepSpeedStrategy.{caller} no longer calls {call}: re-check strategies/hpu_deepspeed.py"
    )
    assert issubclass(_MockOptimizer, torch.optim.Optimizer)
