"""Private names of upstream Lightning and torch that the project relies on, each with where and why.

A failure here means the next upstream release renamed or reshaped one of them: re-check the file named in the
message before anything else.
"""

import ast
import inspect
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple, Optional

import pytest
import torch
import torch.distributed as dist
from lightning.fabric import connector
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.trainer.trainer import Trainer

from virtual_hpu import torch_support


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
    fields = ["_timeout", "_threads", "_devices"]
    if torch_support.installed() >= torch_support.GLOO_OPTIONS_NAME_THEIR_GROUP:
        fields += ["global_ranks_in_group", "group_name"]
    for field in fields:
        assert hasattr(options, field), f"ProcessGroupGloo._Options has no {field}: re-check virtual_hpu/hccl.py"


def test_the_host_fp8_gemm_the_amx_simulation_overrides():
    """``tests_virtual_hpu/amx_host.py``: the simulation of an AMX host replaces the CPU kernel of
    ``aten::_scaled_mm`` (what the virtual Gaudi must never depend on) and restores it with ``Library._destroy``, which
    ``lightning_fabric/plugins/precision/hpu_op_lists.py`` also calls to remove its autocast kernels."""
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key("aten::_scaled_mm", "CPU")
    assert has_kernel or torch_support.installed() < torch_support.HOST_HAS_FP8_GEMM, (
        "aten::_scaled_mm has no CPU kernel any more: re-check tests_virtual_hpu/amx_host.py"
    )
    assert callable(torch.library.Library._destroy), (
        "torch.library.Library._destroy is gone: re-check amx_host.py and plugins/precision/hpu_op_lists.py"
    )


def test_the_host_low_precision_matmul_queries():
    """``virtual_hpu/__init__.py``: the virtual Gaudi computes bf16/fp16 matmuls in fp32 where oneDNN says the host
    has no such matrix instructions (``torch.ops.mkldnn._is_mkldnn_{bf16,fp16}_supported``)."""
    for query in ("_is_mkldnn_bf16_supported", "_is_mkldnn_fp16_supported"):
        assert isinstance(getattr(torch.ops.mkldnn, query)(), bool), (
            f"torch.ops.mkldnn.{query} is gone or changed: re-check virtual_hpu/__init__.py"
        )


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


def test_trainer_builds_the_connector_named_in_its_module():
    """``_lightning_hpu``: every Trainer (``lightning.Trainer``, ours) resolves HPU flags because its module's name
    ``_AcceleratorConnector`` is made to refer to ``HPUAcceleratorConnector``, a subclass of upstream's connector taking
    the same arguments."""
    import lightning.pytorch.trainer.trainer as trainer_module

    from _lightning_hpu.accelerator_connector import HPUAcceleratorConnector

    message = "the Trainer no longer builds `_AcceleratorConnector(...)` from its module: re-check src/_lightning_hpu"
    assert _called_in(trainer_module.Trainer.__init__, "self._accelerator_connector = _AcceleratorConnector("), message
    upstream = HPUAcceleratorConnector.__base__
    assert (upstream.__module__, upstream.__name__) == (
        "lightning.pytorch.trainer.connectors.accelerator_connector",
        "_AcceleratorConnector",
    ), message
    assert inspect.signature(HPUAcceleratorConnector.__init__) == inspect.signature(upstream.__init__), message


def test_trainer_builds_the_callback_connector_named_in_its_module():
    """``_lightning_hpu/callback_connector.py``: every Trainer logs the HPU line and gets the HPU progress bar because
    its module's name ``_CallbackConnector`` is made to refer to ``HPUCallbackConnector``, a subclass of upstream's
    whose ``on_trainer_init`` (the same arguments) runs once the accelerator is chosen and configures the default
    progress bar in ``_configure_progress_bar``."""
    import lightning.pytorch.trainer.trainer as trainer_module

    from _lightning_hpu.callback_connector import HPUCallbackConnector

    message = (
        "the Trainer no longer builds its callback connector as it did: re-check _lightning_hpu/callback_connector.py"
    )
    upstream = HPUCallbackConnector.__base__
    assert (upstream.__module__, upstream.__name__) == (
        "lightning.pytorch.trainer.connectors.callback_connector",
        "_CallbackConnector",
    ), message
    source = inspect.getsource(trainer_module.Trainer.__init__)
    order = [
        "self._accelerator_connector = _AcceleratorConnector(",
        "self._callback_connector = _CallbackConnector(self)",
        "self._callback_connector.on_trainer_init(",
        "setup._log_device_info(self)",
    ]
    assert all(call in source for call in order), message
    assert [source.index(call) for call in order] == sorted(source.index(call) for call in order), message
    assert inspect.signature(HPUCallbackConnector.on_trainer_init) == inspect.signature(upstream.on_trainer_init)
    assert _called_in(upstream.on_trainer_init, "self._configure_progress_bar(enable_progress_bar)"), message
    assert list(inspect.signature(upstream._configure_progress_bar).parameters) == ["self", "enable_progress_bar"]
    assert _called_in(
        upstream._configure_progress_bar, "RichProgressBar() if _RICH_AVAILABLE else TQDMProgressBar()"
    ), "upstream's default progress bars changed: re-check _lightning_hpu/callback_connector.py"


def test_fabric_connector_reads_the_cli_variables_through_one_method():
    """``_lightning_hpu/connector.py``: ``HPUConnector`` applies the ``LT_*`` variables of ``fabric run`` with
    upstream's ``_Connector._argument_from_env`` before resolving, and overrides it so that upstream does not read them
    again: upstream's ``__init__`` must read each flag through ``self._argument_from_env``."""
    from _lightning_hpu.connector import HPUConnector

    # the module's name now refers to our subclass
    _Connector = HPUConnector.__base__
    for flag in ("accelerator", "strategy", "devices", "num_nodes", "precision"):
        assert _called_in(_Connector.__init__, f'self._argument_from_env("{flag}", {flag}, default='), (
            f"upstream's _Connector no longer reads LT_{flag.upper()} through self._argument_from_env: re-check"
            " src/_lightning_hpu/connector.py"
        )
    assert isinstance(inspect.getattr_static(_Connector, "_argument_from_env"), staticmethod)
    assert list(inspect.signature(_Connector._argument_from_env).parameters) == ["name", "current", "default"]


def _statements(method) -> list[str]:
    """The top-level statements of ``method``'s body, unparsed (docstring and formatting aside)."""
    function = ast.parse(textwrap.dedent(inspect.getsource(method))).body[0]
    return [
        ast.unparse(statement)
        for statement in function.body
        if not isinstance(statement, ast.Expr) or not isinstance(statement.value, ast.Constant)
    ]


@pytest.mark.parametrize("framework", ["pytorch", "fabric"])
def test_deepspeed_setup_environment_only_checks_for_cuda(framework):
    """``strategies/hpu_deepspeed.py`` (Trainer and Fabric): ``HPUDeepSpeedStrategy.setup_environment`` checks for the
    HPU accelerator, then calls the level above upstream's ``DeepSpeedStrategy.setup_environment``, whose only work is
    to refuse anything but CUDA. That is only the same chain while upstream's level does nothing else."""
    import importlib

    strategy = importlib.import_module(f"lightning.{framework}.strategies").DeepSpeedStrategy
    statements = _statements(strategy.setup_environment)
    assert len(statements) == 2, (
        f"upstream's {framework} DeepSpeedStrategy.setup_environment does more than check for CUDA now: port what it"
        " added into HPUDeepSpeedStrategy.setup_environment (strategies/hpu_deepspeed.py)"
    )
    check, chain = statements
    assert check.startswith("if not isinstance(self.accelerator, CUDAAccelerator):") and "raise" in check, check
    assert chain == "super().setup_environment()", chain


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


# (library, module, name, file that relies on it, what for): private names that must exist with the shape we use.
# The hooks whose call sites matter are pinned by the tests above; these are imported or read as attributes. The names
# we change are the rows of the tables in `foreign_names.py`, pinned by the tests at the end of this file.
PRIVATE_NAMES = [
    ("lightning", "lightning.fabric.utilities.types", "_DEVICE", "strategies/single_hpu.py", "device type alias"),
    ("lightning", "lightning.fabric.utilities.types", "_PATH", "plugins/io/hpu.py", "path type alias"),
    (
        "lightning",
        "lightning.fabric.utilities.distributed",
        "_destroy_dist_connection",
        "strategies/_hpu.py",
        "destroy the group at exit, before interpreter shutdown",
    ),
    ("lightning", "lightning.fabric.connector", "_Connector", "_lightning_hpu", "Fabric's connector, subclassed"),
    ("lightning", "lightning.fabric.connector", "_PLUGIN_INPUT", "_lightning_hpu/connector.py", "argument types"),
    ("lightning", "lightning.fabric.connector", "_PRECISION_INPUT", "_lightning_hpu/connector.py", "argument types"),
    (
        "lightning",
        "lightning.fabric.connector",
        "_convert_precision_to_unified_args",
        "plugins/precision/hpu.py",
        "precision flags in unified form",
    ),
    ("lightning", "lightning.fabric.strategies", "_StrategyRegistry", "strategies/*.py", "registering names"),
    (
        "lightning",
        "lightning.fabric.accelerators.registry",
        "_AcceleratorRegistry",
        "accelerators/hpu.py",
        "registering 'hpu'",
    ),
    (
        "lightning",
        "lightning.pytorch.utilities.argparse",
        "_defaults_from_env_vars",
        "trainer/trainer.py",
        "PL_TRAINER_* defaults on our Trainer",
    ),
    (
        "lightning",
        "lightning.pytorch.trainer.connectors.accelerator_connector",
        "_AcceleratorConnector",
        "_lightning_hpu",
        "the Trainer's connector, subclassed",
    ),
    (
        "lightning",
        "lightning.pytorch.trainer.connectors.accelerator_connector",
        "_LITERAL_WARN",
        "_lightning_hpu/accelerator_connector.py",
        "argument types",
    ),
    (
        "lightning",
        "lightning.pytorch.trainer.connectors.accelerator_connector",
        "_PRECISION_INPUT",
        "_lightning_hpu/accelerator_connector.py",
        "argument types",
    ),
    ("lightning", "lightning.pytorch.plugins", "_PLUGIN_INPUT", "_lightning_hpu/accelerator_connector.py", "types"),
    (
        "lightning",
        "lightning.fabric.connector",
        "_convert_precision_to_unified_args",
        "_lightning_hpu/precision_choice.py",
        "a precision flag compared with the strategy's plugin",
    ),
    ("lightning", "lightning.pytorch.profilers.pytorch", "_KINETO_AVAILABLE", "profilers/hpu.py", "trace support"),
    (
        "lightning",
        "lightning.pytorch.loops.training_epoch_loop",
        "_TrainingEpochLoop",
        "strategies/_sigterm.py",
        "the epoch loop our Trainer installs",
    ),
    (
        "lightning",
        "lightning.pytorch.trainer.connectors.signal_connector",
        "_SignalConnector",
        "strategies/_sigterm.py",
        "the signal connector our Trainer installs",
    ),
    (
        "lightning",
        "lightning.pytorch.overrides.distributed",
        "_register_ddp_comm_hook",
        "strategies/hpu_parallel.py",
        "DDP communication hooks over HCCL",
    ),
    (
        "lightning",
        "lightning.pytorch.strategies.launchers.subprocess_script",
        "_SubprocessScriptLauncher",
        "strategies/_failure.py",
        "killing the ranks a rank started when it fails alone",
    ),
    (
        "torch",
        "torch.distributed.distributed_c10d",
        "_get_default_store",
        "strategies/_failure.py",
        "the store the ranks report failures in",
    ),
    (
        "lightning",
        "lightning.pytorch.core.optimizer",
        "_MockOptimizer",
        "strategies/hpu_deepspeed.py",
        "recognising a missing optimizer",
    ),
    ("torch", "torch._dynamo.utils", "counters", "virtual_hpu/compilation.py", "graph breaks of hpu_backend"),
    ("torch", "torch._dynamo.utils", "guard_failures", "virtual_hpu/compilation.py", "recompilation reasons"),
    ("torch", "torch", "_register_device_module", "virtual_hpu/_facade/.../torch/__init__.py", "torch.hpu"),
    ("torch", "torch._C", "_dispatch_keyset_full", "virtual_hpu/graph_capture.py", "replay below autograd"),
    ("torch", "torch._C", "_dispatch_keyset_full_after", "virtual_hpu/graph_capture.py", "replay below autograd"),
    (
        "torch",
        "torch.utils._python_dispatch",
        "TorchDispatchMode",
        "virtual_hpu/graph_capture.py",
        "recording a capture",
    ),
    ("torch", "torch._C", "_ExcludeDispatchKeyGuard", "virtual_hpu/graph_capture.py", "replay below autograd"),
    ("torch", "torch._C", "_dispatch_get_all_op_names", "virtual_hpu/op_names.py", "validating op lists"),
    (
        "torch",
        "torch._functorch.aot_autograd",
        "make_boxed_func",
        "virtual_hpu/.../compile_backend/backends.py",
        "hpu_backend",
    ),
    (
        "torch",
        "torch",
        "_TorchCompileInductorWrapper",
        "lightning_fabric/strategies/_hpu_compile.py",
        "telling inductor apart",
    ),
    (
        "lightning",
        "lightning.fabric.wrappers",
        "_capture_compile_kwargs",
        "lightning_fabric/strategies/_hpu_compile.py",
        "the `_compile_kwargs` Fabric re-applies",
    ),
    (
        "torch",
        "torch._dynamo.variables.torch",
        "constant_fold_functions",
        "virtual_hpu/.../dynamo/trace_rules.py",
        "the bridge's constant-folded hpu queries",
    ),
    (
        "torch",
        "torch._dynamo.trace_rules",
        "_allowed_callable_ids",
        "virtual_hpu/.../dynamo/trace_rules.py",
        "the bridge's in-graph hpu stream functions",
    ),
    (
        "torch",
        "torch._dynamo",
        "OptimizedModule",
        "lightning_fabric/strategies/_hpu_compile.py",
        "finding compiled modules",
    ),
    ("torch", "torch._C", "_has_cuda", "virtual_hpu/__init__.py", "telling a build with another accelerator"),
    ("torch", "torch._C", "_has_xpu", "virtual_hpu/__init__.py", "telling a build with another accelerator"),
    ("torch", "torch._C", "_has_mps", "virtual_hpu/__init__.py", "telling a build with another accelerator"),
    ("torch", "torch._C", "_get_privateuse1_backend_name", "virtual_hpu/__init__.py", "PrivateUse1 free or ours"),
    ("torch", "torch._C._dynamo", "compiled_autograd", "virtual_hpu/.../compile_backend/experimental.py", "hooks"),
    (
        "torch",
        "torch._C",
        "_get_privateuse1_backend_name",
        "lightning_fabric/plugins/precision/hpu_op_lists.py",
        "which autocast dispatch key hpu's is",
    ),
    (
        "deepspeed",
        "deepspeed.utils.groups",
        "_release_process_group_references",
        "lightning_fabric/strategies/hpu_deepspeed.py",
        "releasing the groups of an ended world (Intel's fork lacks it: globals reset, see foreign_names)",
    ),
    (
        "neural_compressor",
        "neural_compressor.torch.algorithms.fp8_quant._quant_common",
        "quant_config",
        "lightning_fabric/plugins/precision/_fp8_inference.py",
        "reading INC's quantization mode",
    ),
]


@pytest.mark.parametrize(
    ("library", "module", "name", "where", "purpose"),
    PRIVATE_NAMES,
    ids=[f"{m}.{n}" for _, m, n, _, _ in PRIVATE_NAMES],
)
def test_private_names_exist(library, module, name, where, purpose):
    import importlib

    pytest.importorskip(library)
    assert hasattr(importlib.import_module(module), name), (
        f"{library} no longer has {module}.{name}, which {where} uses ({purpose}): re-check that file"
    )


@pytest.mark.parametrize(
    ("owner", "attribute", "where"),
    [
        (
            "lightning.pytorch.loops.training_epoch_loop._TrainingEpochLoop",
            "_batches_that_stepped",
            "callbacks/hpu_performance.py",
        ),
        ("lightning.pytorch.profilers.pytorch.PyTorchProfiler", "_has_on_trace_ready", "profilers/hpu.py"),
        ("lightning.pytorch.trainer.trainer.Trainer", "_signal_connector", "trainer/trainer.py"),
        ("lightning.pytorch.loops.fit_loop._FitLoop", "epoch_loop", "trainer/trainer.py"),
        # Fabric wraps the module it compiled again; `_hpu_compile` replaces it as it is registered
        ("lightning.fabric.wrappers._FabricModule", "_forward_module", "lightning_fabric/strategies/_hpu_compile.py"),
        ("torch._dynamo.eval_frame._TorchDynamoContext", "_dynamic", "lightning_fabric/strategies/_hpu_compile.py"),
        pytest.param(
            "torch._dynamo.eval_frame._TorchDynamoContext",
            "fullgraph",
            "lightning_fabric/strategies/_hpu_compile.py",
            marks=pytest.mark.skipif(torch_support.installed() < (2, 9), reason="set from torch 2.9"),
        ),
        # what a compile wrapper wraps: renamed in torch 2.9
        pytest.param(
            "torch._dynamo.convert_frame.ConvertFrameAssert",
            "_torchdynamo_orig_backend",
            "lightning_fabric/strategies/_hpu_compile.py",
            marks=pytest.mark.skipif(torch_support.installed() < (2, 9), reason="the name from torch 2.9"),
        ),
        pytest.param(
            "torch._dynamo.convert_frame.ConvertFrameAssert",
            "_torchdynamo_orig_callable",
            "lightning_fabric/strategies/_hpu_compile.py",
            marks=pytest.mark.skipif(torch_support.installed() >= (2, 9), reason="the name before torch 2.9"),
        ),
        # the inference engine's dtype, which the precision plugin casts inputs to
        ("deepspeed.inference.engine.InferenceEngine", "_config", "strategies/hpu_deepspeed.py"),
        # a compiled module's original and its compile context, read to compile it again for HPU
        ("torch._dynamo.eval_frame.OptimizedModule", "_orig_mod", "lightning_fabric/strategies/_hpu_compile.py"),
        ("torch._dynamo.eval_frame.OptimizedModule", "dynamo_ctx", "lightning_fabric/strategies/_hpu_compile.py"),
        # DDP's options, which the HPU data-parallel strategies complete with Intel's for HCCL
        ("lightning.fabric.strategies.DDPStrategy", "_ddp_kwargs", "lightning_fabric/strategies/hpu_ddp_options.py"),
        ("lightning.pytorch.strategies.DDPStrategy", "_ddp_kwargs", "lightning_fabric/strategies/hpu_ddp_options.py"),
        # the function an instance converted to the HPU strategy is built with
        (
            "lightning.fabric.strategies.ModelParallelStrategy",
            "_parallelize_fn",
            "lightning_fabric/strategies/hpu_model_parallel.py",
        ),
    ],
)
def test_private_attributes_set_by_upstream(owner, attribute, where):
    """Attributes of upstream objects that we read or replace: upstream's class still sets them."""
    import importlib
    import re

    module, _, class_name = owner.rpartition(".")
    source = inspect.getsource(getattr(importlib.import_module(module), class_name))
    assert re.search(rf"self\.{attribute}\s*(:[^=\n]*)?=", source), (
        f"{owner} no longer sets {attribute}: re-check {where}"
    )


def test_process_group_default_backend_setter():
    """``strategies/_sigterm.py``: the SIGTERM agreement's group of "device:backend" pairs is given gloo as its default
    backend, which torch leaves unset when a backend plugin is registered (and then warns when destroying it)."""
    assert hasattr(dist.ProcessGroup, "_set_default_backend") and hasattr(dist.ProcessGroup.BackendType, "GLOO"), (
        "ProcessGroup._set_default_backend changed: re-check strategies/_sigterm.py"
    )


@pytest.mark.parametrize(
    ("owner", "method", "where"),
    [
        ("lightning.pytorch.strategies.DeepSpeedStrategy", "_auto_select_batch_size", "strategies/hpu_deepspeed.py"),
        ("lightning.pytorch.strategies.DeepSpeedStrategy", "_format_config", "strategies/hpu_deepspeed.py"),
        ("lightning.pytorch.strategies.DeepSpeedStrategy", "_init_optimizers", "strategies/hpu_deepspeed.py"),
        (
            "lightning.pytorch.strategies.DeepSpeedStrategy",
            "_initialize_deepspeed_inference",
            "strategies/hpu_deepspeed.py",
        ),
        (
            "lightning.pytorch.strategies.DeepSpeedStrategy",
            "_initialize_deepspeed_train",
            "strategies/hpu_deepspeed.py",
        ),
        (
            "lightning.fabric.strategies.DeepSpeedStrategy",
            "_format_config",
            "lightning_fabric/strategies/hpu_deepspeed.py",
        ),
        (
            "lightning.fabric.strategies.DeepSpeedStrategy",
            "_setup_distributed",
            "lightning_fabric/strategies/hpu_deepspeed.py",
        ),
        (
            "lightning.fabric.strategies.DDPStrategy",
            "_setup_distributed",
            "lightning_fabric/strategies/hpu_parallel.py",
        ),
        ("torch.optim.Adam", "_init_group", "virtual_hpu/.../hpex/optimizers/_markstep.py"),
        ("torch.optim.AdamW", "_init_group", "virtual_hpu/.../hpex/optimizers/_markstep.py"),
        ("torch.Tensor", "_make_subclass", "virtual_hpu/_facade/.../torch/hpu/__init__.py"),
        (
            "lightning.fabric.strategies.FSDPStrategy",
            "_setup_distributed",
            "lightning_fabric/strategies/hpu_fsdp.py",
        ),
        (
            "lightning.pytorch.strategies.ModelParallelStrategy",
            "_setup_distributed",
            "strategies/hpu_model_parallel.py",
        ),
        (
            "lightning.fabric.strategies.ModelParallelStrategy",
            "_setup_distributed",
            "lightning_fabric/strategies/hpu_model_parallel.py",
        ),
        (
            "lightning.fabric.strategies.DDPStrategy",
            "_determine_ddp_device_ids",
            "lightning_fabric/strategies/hpu_parallel.py",
        ),
    ],
)
def test_overridden_private_methods_exist(owner, method, where):
    """Private methods of upstream classes that our subclasses override and call through ``super()``, or call."""
    import importlib

    module, _, class_name = owner.rpartition(".")
    assert callable(getattr(getattr(importlib.import_module(module), class_name), method, None)), (
        f"{owner}.{method} is gone: re-check {where}"
    )


# ---------------------------------------------------------------------------------------------------------------------
# The tables of changed foreign names: `virtual_hpu.foreign_names` and `_lightning_hpu.foreign_names`

_SRC = Path(__file__).parents[2] / "src"
_OURS = {"virtual_hpu", "_lightning_hpu", "pytorch_lightning", "lightning_fabric", "habana_frameworks"}

# (file, function): the attributes they set that are not names of torch or upstream, though the scan cannot tell
_OWN_OBJECTS = {
    ("_lightning_hpu/__init__.py", "_AfterConnectorImport.find_spec"): "the spec it hands the import system",
    ("_lightning_hpu/__init__.py", "_ThenUseHPUConnector.exec_module"): "the module keeps its own loader",
    ("_lightning_hpu/precision_choice.py", "PrecisionChoice._on_strategy"): "the plugin of a strategy instance",
    ("_lightning_hpu/aliasing.py", "_UpstreamModuleLoader.exec_module"): "an upstream module keeps its own spec",
    ("_lightning_hpu/aliasing.py", "extend_upstream"): "our own packages",
    ("pytorch_lightning/callbacks/hpu_performance.py", "HPUPerformanceMonitor.on_fit_end"): "our report",
    ("lightning_fabric/plugins/precision/_fp8_training.py", "replace_linear_layers"): "the layers of the user's model",
    ("lightning_fabric/strategies/_hpu.py", "_HPUStrategyMixin.from_upstream"): "our strategy instance",
    ("lightning_fabric/strategies/_hpu_compile.py", "compile_submodules_for_hpu"): "the children of the user's model",
    ("pytorch_lightning/strategies/_sigterm.py", "_TrainingEpochLoop._broadcast_sigterm_tensor"): "our connector",
    ("pytorch_lightning/trainer/_compiled.py", "keep_logging_eager"): "the user's LightningModule",
    ("pytorch_lightning/trainer/trainer.py", "Trainer"): "our Trainer's __init__",
    ("virtual_hpu/compilation.py", "*"): "its own counters",
    ("virtual_hpu/hccl.py", "_copy_options"): "a copy of gloo's options it made",
    ("virtual_hpu/hccl.py", "_create_backend"): "a gloo backend it made",
    ("virtual_hpu/_facade/habana_frameworks/torch/hpex/experimental/transformer_engine/fp8.py", "*"): "its state",
    ("virtual_hpu/_facade/habana_frameworks/torch/hpex/experimental/transformer_engine/module.py", "*"): "autograd ctx",
    ("virtual_hpu/_facade/habana_frameworks/torch/hpex/kernels/FusedSDPA.py", "*"): "autograd ctx",
    ("virtual_hpu/_facade/habana_frameworks/torch/hpex/kernels/RotaryPosEmbeddingHelper.py", "*"): "autograd ctx",
    ("virtual_hpu/_facade/habana_frameworks/torch/hpu/__init__.py", "*"): "its own settings",
    ("virtual_hpu/_facade/habana_frameworks/torch/hpu/graphs.py", "*"): "the user's module, wrapped as the bridge does",
    ("virtual_hpu/_facade/habana_frameworks/torch/hpu/random.py", "*"): "its own generator state",
    ("virtual_hpu/_facade/habana_frameworks/torch/utils/experimental.py", "*"): "the user's module, as the bridge",
}


def _foreign_tables():
    from _lightning_hpu.foreign_names import FOREIGN_NAMES as product
    from virtual_hpu.foreign_names import FOREIGN_NAMES as virtual_gaudi

    return virtual_gaudi + product


class _Change(NamedTuple):
    by: str  # file::function
    targets: Optional[tuple[str, ...]]  # the foreign names, or None where the scan cannot tell whose it is
    code: str


class _ForeignWrites(ast.NodeVisitor):
    """Assignments, deletions, item writes and ``setattr`` calls on names of other packages in one file of ``src/``.

    A name is resolved through the file's imports, a function's local aliases of imported names, its loops over
    tuples of them, and ``importlib.import_module("...")``; attributes of ``self`` and ``cls`` are not foreign. What
    cannot be resolved is reported with ``targets=None``.
    """

    def __init__(self, file: str, tree: ast.Module) -> None:
        self.file = file
        self.imports: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.imports[alias.asname] = alias.name
                    else:
                        root = alias.name.split(".")[0]
                        self.imports[root] = root
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        self.scope: list[str] = []
        self.aliases: list[dict[str, list]] = [{}]
        self.changes: list[_Change] = []
        self.visit(tree)

    def _foreign(self, dotted: str) -> bool:
        root = dotted.split(".")[0]
        return root not in _OURS and root not in sys.stdlib_module_names

    def _resolve(self, node: ast.AST) -> Optional[list]:
        """The dotted names (or string constants) ``node`` may be, or None."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Name):
            for aliases in reversed(self.aliases):
                if node.id in aliases:
                    return aliases[node.id]
            return [self.imports[node.id]] if node.id in self.imports else None
        if isinstance(node, ast.Attribute):
            base = self._resolve(node.value)
            return None if base is None else [f"{name}.{node.attr}" for name in base]
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "importlib.import_module" and node.args:
            return self._resolve(node.args[0])
        if isinstance(node, (ast.Tuple, ast.List)):
            names = [self._resolve(element) for element in node.elts]
            return None if None in names else [name for each in names for name in each]
        return None

    def _scoped(self, node: ast.AST) -> None:
        self.scope.append(node.name)
        self.aliases.append({})
        self.generic_visit(node)
        self.aliases.pop()
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def _record(self, owner: ast.AST, attribute: Optional[str], code: ast.AST) -> None:
        root = owner
        while isinstance(root, (ast.Attribute, ast.Subscript)):
            root = root.value
        if isinstance(root, ast.Name) and root.id in ("self", "cls"):
            return
        base = self._resolve(owner)
        by = f"{self.file}::{'.'.join(self.scope) or '<module>'}"
        if base is None:
            self.changes.append(_Change(by, None, ast.unparse(code)))
            return
        targets = tuple(name if attribute is None else f"{name}.{attribute}" for name in base if self._foreign(name))
        if targets:
            self.changes.append(_Change(by, targets, ast.unparse(code)))

    def _target(self, target: ast.AST, code: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._target(element, code)
        elif isinstance(target, ast.Attribute):
            self._record(target.value, target.attr, code)
        elif isinstance(target, ast.Subscript):
            # an item of a foreign container; an item of anything else is no name
            if self._resolve(target.value) is not None:
                self._record(target.value, None, code)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._target(target, node)
            value = self._resolve(node.value)
            if isinstance(target, ast.Name) and value is not None and all(map(self._foreign, value)):
                self.aliases[-1][target.id] = value
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AST) -> None:
        self._target(node.target, node)
        self.generic_visit(node)

    visit_AnnAssign = visit_AugAssign

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._target(target, node)
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        names = self._resolve(node.iter)
        if isinstance(node.target, ast.Name) and names is not None:
            self.aliases[-1][node.target.id] = names
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") and len(node.args) >= 2:
            name = node.args[1]
            attribute = name.value if isinstance(name, ast.Constant) else "*"
            self._record(node.args[0], attribute, node)
        self.generic_visit(node)


def _foreign_writes() -> list[_Change]:
    changes = []
    for path in sorted(_SRC.rglob("*.py")):
        file = path.relative_to(_SRC).as_posix()
        if not file.endswith(".egg-info") and ".egg-info/" not in file:
            changes += _ForeignWrites(file, ast.parse(path.read_text())).changes
    return changes


def test_every_change_to_a_foreign_name_is_in_a_table():
    """Every name of torch or upstream that code in ``src/`` rebinds, adds or deletes is a row of the virtual Gaudi's
    table or the product's (``foreign_names.py`` in ``virtual_hpu`` and ``_lightning_hpu``), changed by the code the
    row names; every row still matches such code."""
    rows = _foreign_tables()
    by_target = {(row.by, row.target) for row in rows}
    unlisted, matched, own = [], set(), set()
    for change in _foreign_writes():
        file, function = change.by.split("::")
        if change.targets is None:
            # the scan cannot tell whose name it is: a row names this code, or it is listed as our own or the user's
            rows_here = {(row.by, row.target) for row in rows if row.by == change.by}
            if rows_here:
                matched |= rows_here
            elif (file, function) in _OWN_OBJECTS or (file, "*") in _OWN_OBJECTS:
                own.add((file, function) if (file, function) in _OWN_OBJECTS else (file, "*"))
            else:
                unlisted.append(f"{change.by}: {change.code}")
            continue
        for target in change.targets:
            if (change.by, target) in by_target:
                matched.add((change.by, target))
            else:
                unlisted.append(f"{change.by}: {target} ({change.code})")
    assert not unlisted, (
        "code in src/ changes names of torch or upstream that no table lists: add a row to foreign_names.py of its"
        " package (target, replacement, when, why, off switch), or, for our own or the user's objects, to"
        " _OWN_OBJECTS here:\n" + "\n".join(unlisted)
    )
    assert by_target == matched, f"rows that no code in src/ matches any more: {sorted(by_target - matched)}"
    assert own == set(_OWN_OBJECTS), f"_OWN_OBJECTS entries that match no code any more: {set(_OWN_OBJECTS) - own}"


# where a row's target is an attribute of an instance torch makes later, the class whose instances have it
_INSTANCE_OWNERS = {"torch.distributed.GroupMember.WORLD": "torch.distributed.ProcessGroup"}

_FOREIGN_TARGETS_EXIST = """
import importlib, json, sys
import torch
from virtual_hpu.foreign_names import FOREIGN_NAMES as virtual_gaudi
from _lightning_hpu.foreign_names import FOREIGN_NAMES as product
instance_owners = json.loads(sys.argv[1])
missing = []
for row in virtual_gaudi + product:
    if row.since and torch.torch_version.TorchVersion(torch.__version__) < row.since:
        continue  # an older torch, which lacks the target and where the change is not made
    owner, _, name = row.target.rpartition(".")
    owner = instance_owners.get(owner, owner)
    parts = owner.split(".")
    for split in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for part in parts[split:]:
                value = getattr(value, part)
        except AttributeError:
            value = None
        break
    if value is None or (row.kind == "rebound" and not hasattr(value, name)):
        missing.append(row.target)
print(json.dumps(missing))
"""


def test_the_foreign_names_in_the_tables_exist():
    """Each row's target exists in the installed torch and Lightning (where it is added, its owner does), as the
    owner has it: read in a process where nothing is changed (no Gaudi, no autoload)."""
    import json
    import os
    import subprocess

    env = {key: value for key, value in os.environ.items() if not key.startswith(("VIRTUAL_HPU", "PT_HPU"))}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    result = subprocess.run(
        [sys.executable, "-c", _FOREIGN_TARGETS_EXIST, json.dumps(_INSTANCE_OWNERS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    missing = json.loads(result.stdout.strip().splitlines()[-1])
    assert not missing, (
        f"torch or Lightning no longer has {missing}, which a row of foreign_names.py changes: re-check the code the"
        " row names (`by`)"
    )
