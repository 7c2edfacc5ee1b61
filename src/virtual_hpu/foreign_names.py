"""Every name owned by torch that the virtual Gaudi changes: what, to what, when, why, and how to do without.

The virtual Gaudi extends torch through torch's own means for a device extension: a C++ library for the device, its
kernels registered with ``torch.library``, ``torch._register_device_module("hpu", ...)``, a c10d backend registered
with ``torch.distributed.Backend.register_backend``, settings made through torch's setters
(``torch.set_autocast_dtype``, ``torch.autograd.set_multithreading_enabled``). Those change no name. Where torch has
no such means, it rebinds or adds a name of torch's own, and each such change is a row of :data:`FOREIGN_NAMES`;
``tests/tests_pytorch/test_upstream_contracts.py`` fails when a row's target is gone from torch, when code in ``src/``
changes a name of torch or upstream Lightning that no row lists, and when a row no longer matches any code.
The product's own table is :data:`_lightning_hpu.foreign_names.FOREIGN_NAMES`. This module imports nothing.
"""

from typing import NamedTuple


class ForeignName(NamedTuple):
    """One change to a name another package owns."""

    #: the name, as its owner spells it (``torch.profiler._supported_activities``)
    target: str
    #: what it refers to afterwards
    replacement: str
    #: the code that changes it, ``file::function`` (the file relative to ``src/``)
    by: str
    #: when the change is made; whether it is undone
    when: str
    #: why nothing less would do
    why: str
    #: how a user does without it
    off_switch: str
    #: ``"rebound"`` (the owner has the name; it is replaced) or ``"added"`` (the owner lacks it; it is added)
    kind: str = "rebound"
    #: the first torch release known to have the target, where older ones of the supported range lack it (and the
    #: change is not made there); empty where every supported release has it
    since: str = ""


_ACTIVATION = "virtual_hpu/__init__.py"
_WHERE_PRIVATEUSE1 = (
    "at activation, where hpu is torch's PrivateUse1 backend (`virtual_hpu.is_privateuse1()`: a torch 2.9 or later"
    " built for another accelerator); for the process"
)
_NOT_ACTIVATED = "VIRTUAL_HPU unset or 0 (no activation); on torch's CPU build it is never made"

FOREIGN_NAMES = (
    *(
        ForeignName(
            f"{module}._get_foreach_kernels_supported_devices",
            "torch's function, without 'hpu' in the list it returns",
            f"{_ACTIVATION}::_optimizers_per_tensor_on_hpu",
            _WHERE_PRIVATEUSE1,
            "torch's optimizers, gradient clipping and SWA default to their foreach path on PrivateUse1 and not on its"
            " HPU device type: without it they would leave Gaudi's per-tensor default and numerics; each module"
            " holds its own reference to torch's function",
            _NOT_ACTIVATED,
        )
        for module in ("torch.utils._foreach_utils", "torch.optim.optimizer", "torch.optim.swa_utils")
    ),
    *(
        ForeignName(
            f"{module}._supported_activities",
            "torch's function, with ProfilerActivity.HPU in the set it returns",
            f"{_ACTIVATION}::_profiler_takes_hpu_activity",
            _WHERE_PRIVATEUSE1,
            "torch's profiler reports the HPU activity only for its HPU device type: without it"
            " `ProfilerActivity.HPU` in Gaudi code raises where hpu is PrivateUse1; each module holds its own"
            " reference to torch's function",
            _NOT_ACTIVATED,
        )
        for module in ("torch.autograd", "torch.autograd.profiler", "torch.profiler")
    ),
    ForeignName(
        "torch._prims.rng_prims.run_dtensor_rng_op.py_kernels",
        "its BackendSelect kernel: torch's, run inside `set_rng_ctx('philox')`",
        f"{_ACTIVATION}::_dtensor_random_ops_in_philox_context",
        "at activation, where torch has the operator (2.13 has, 2.11 has not); for the process",
        "DTensor's random ops on the accelerator read and write its generator state as a philox (seed, offset) pair;"
        " a Gaudi gives that pair inside `set_rng_ctx('philox')`, which torch enters for hpu only on its other path:"
        " without it random initialisation of a DTensor on hpu fails (seen on torch 2.15)",
        _NOT_ACTIVATED,
        since="2.13",
    ),
    ForeignName(
        "torch.distributed.ProcessGroupGloo.perform_nocolor_split",
        "a method that does nothing (`virtual_hpu.hccl._no_split`)",
        "virtual_hpu/hccl.py::register",
        "when the 'hccl' backend is registered (importing `habana_frameworks.torch.distributed.hccl`), where torch's"
        " gloo lacks the method; for the process",
        "`new_group` on a group bound to a device has the ranks left out take part in a split of the device's backend;"
        " gloo, which serves 'hccl' here, says it can split but has no such step",
        "do not bind the default group to a device (`init_process_group` without `device_id`)",
        kind="added",
    ),
    ForeignName(
        "torch.distributed.ProcessGroupGloo._Options.__deepcopy__",
        "a copy made field by field (`virtual_hpu.hccl._copy_options`)",
        "virtual_hpu/hccl.py::register",
        "when the 'hccl' backend is registered, where gloo's options cannot be deep-copied; for the process",
        "`split_group` (an `init_device_mesh` of more than one dimension over a bound group) starts from a deep copy"
        " of the parent backend's options",
        "do not bind the default group to a device (`init_process_group` without `device_id`)",
        kind="added",
    ),
    ForeignName(
        "torch.distributed.Backend.default_device_backend_map",
        "its 'hpu' entry set to 'hccl'",
        "virtual_hpu/hccl.py::register",
        "when the 'hccl' backend is registered, before torch 2.12 and only where torch's fake process group (imported"
        " with FSDP) claimed hpu first; for the process",
        "a group created without a backend name must be HCCL on hpu, as on a Gaudi",
        "name the backend (`init_process_group('hccl')`)",
    ),
    ForeignName(
        "torch._tensor_str.tensor_totype",
        "torch's function, casting hpu tensors to float32 instead of float64",
        "virtual_hpu/_facade/habana_frameworks/torch/__init__.py::_print_in_fp32",
        "at activation (importing `habana_frameworks.torch`); for the process",
        "printing casts values to float64, which Gaudi lacks; torch does the same for MPS",
        _NOT_ACTIVATED,
    ),
    ForeignName(
        "torch._dynamo.compiled_autograd.compiled_autograd_enabled",
        "True, with torch's autograd compiler set to compile with hpu_backend (`set_autograd_compiler`), backward on"
        " the calling thread and the autograd fallback off",
        "virtual_hpu/_facade/habana_frameworks/torch/dynamo/compile_backend/experimental.py::enable_compiled_autograd",
        "when `enable_compiled_autograd()` is called; for the process",
        "the bridge's `enable_compiled_autograd` switches torch's compiled autograd on this way; torch's own switch"
        " (`compiled_autograd._enable`) is a context manager",
        "do not call `enable_compiled_autograd()`",
    ),
    ForeignName(
        "torch._dynamo.config.optimize_ddp",
        "'python_reducer'",
        "virtual_hpu/_facade/habana_frameworks/torch/dynamo/compile_backend/experimental.py::enable_compiled_autograd",
        "when `enable_compiled_autograd()` is called; for the process",
        "as the bridge does, DDP's gradient reduction becomes part of the compiled backward",
        "do not call `enable_compiled_autograd()`",
    ),
)
