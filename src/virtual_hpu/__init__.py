"""A virtual Intel Gaudi: ``torch.device("hpu")`` on host memory, with the ``habana_frameworks`` API behind it.

Nothing happens on import. ``activate()`` (or ``VIRTUAL_HPU=1`` with ``activate_from_env()``) builds and loads a
small torch extension, registers ``torch.hpu`` and makes a ``habana_frameworks`` facade importable. It refuses to
run where a real Gaudi software stack is installed.
"""

import importlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import Any, Optional

from virtual_hpu._config import Config, as_hardware, resolve

__all__ = [
    "Config",
    "activate",
    "activate_from_env",
    "config",
    "is_active",
    "is_privateuse1",
    "is_torch_accelerator",
    "other_accelerator",
    "real_installation",
]

_log = logging.getLogger(__name__)
_FACADE = Path(__file__).parent / "_facade"
_active: Optional[Config] = None


def is_active() -> bool:
    """Whether this process has a virtual Gaudi; False while it poses as hardware (``VIRTUAL_HPU_AS_HARDWARE=1``)."""
    return _active is not None and not as_hardware()


def config() -> Config:
    """The active configuration; raises ``RuntimeError`` before activation."""
    if _active is None:
        raise RuntimeError("The virtual Gaudi is not active: call virtual_hpu.activate() or set VIRTUAL_HPU=1")
    return _active


def real_installation() -> Optional[str]:
    """Where Intel's Gaudi software (``habana_frameworks``) is installed, or None; the virtual Gaudi's own facade does
    not count."""
    # on the path only: the import hook that activates us in lazy mode (``_autoload``) is not an installation
    spec = importlib.machinery.PathFinder.find_spec("habana_frameworks")
    if spec is None:
        return None
    locations = [Path(p).resolve() for p in (spec.submodule_search_locations or [])]
    if all(path.parent == _FACADE.resolve() for path in locations):
        return None
    return ", ".join(map(str, locations)) or spec.origin


def _refuse_real_installation() -> None:
    where = real_installation()
    if where is not None:
        raise RuntimeError(
            f"A real Intel Gaudi software stack is installed (habana_frameworks at {where}); the virtual Gaudi will not"
            " shadow it. Unset VIRTUAL_HPU and use the real device."
        )


def other_accelerator() -> Optional[str]:
    """The accelerator this build of torch has besides the virtual device (``"cuda"`` for PyPI's default on Linux), or
    None (the CPU build, and Gaudi's torch).

    torch has one accelerator, and its autograd synchronizes the streams of that device type only. Gaudi's torch has
    the HPU device type; on a build with another accelerator the virtual device is torch's PrivateUse1 backend, named
    "hpu", which then is torch's accelerator (see ``activate``). Read from how torch was built, without asking torch for
    its accelerator: that would fix it before the virtual device registers.
    """
    import torch

    for name, built in (("cuda", torch._C._has_cuda), ("xpu", torch._C._has_xpu), ("mps", torch._C._has_mps)):
        if built:
            return name
    return None


def is_privateuse1() -> bool:
    """Whether the virtual device is torch's PrivateUse1 backend named "hpu" (a build with another accelerator, from
    torch 2.9 on), rather than torch's HPU device type (the CPU build, Gaudi's torch, and any build before 2.9).

    Before torch 2.9 the string "hpu" always names the HPU device type, so a renamed PrivateUse1 backend cannot be
    reached by that name; the HPU device type trains on those builds for CUDA too (``tests/tests_torch_build``).
    """
    import torch

    from virtual_hpu import torch_support

    release = torch_support.release_of(torch.__version__)
    return other_accelerator() is not None and release >= torch_support.PRIVATEUSE1_TAKES_BUILTIN_NAMES


def is_torch_accelerator() -> bool:
    """Whether the virtual device is torch's accelerator (``torch.accelerator``), as hpu is on a Gaudi: everywhere but
    on a build for another accelerator before torch 2.9, where the HPU device type sits beside that one. There torch
    2.7 and 2.8 take the accelerator a build is for, and refuse two in every backward pass; torch 2.6 takes the one
    with a device present, so hpu where that other one has none."""
    import torch

    from virtual_hpu import torch_support

    other = other_accelerator()
    if other is None or is_privateuse1():
        return True
    before_builds_decide = torch_support.installed() < torch_support.ACCELERATOR_IS_THE_BUILDS
    return before_builds_decide and not getattr(torch, other).is_available()


def _claim_privateuse1() -> None:
    """On a build with another accelerator, names torch's PrivateUse1 backend "hpu", before the library registers it.

    A PrivateUse1 backend named otherwise is another device extension, and would be torch's accelerator instead
    (on the CPU build too): refused.
    """
    import torch

    ours = "hpu" if is_privateuse1() else "privateuseone"
    name = torch._C._get_privateuse1_backend_name()
    if name == "privateuseone" and ours == "hpu":
        torch.utils.rename_privateuse1_backend("hpu")
    elif name != ours:
        raise RuntimeError(
            f"torch's PrivateUse1 backend is already {name!r} in this process (another device extension), and torch"
            " has one accelerator: with it, every backward pass over hpu tensors would fail. Do not load that"
            " extension in a process with the virtual Gaudi (or unset VIRTUAL_HPU)."
        )


def _optimizers_per_tensor_on_hpu() -> None:
    """torch's optimizers, gradient clipping and SWA default to their foreach path on its PrivateUse1 backend, not on
    its HPU device type: where hpu is PrivateUse1, they keep Gaudi's per-tensor default (and its numerics)."""
    from torch.utils import _foreach_utils

    devices = _foreach_utils._get_foreach_kernels_supported_devices

    def without_hpu() -> list[str]:
        return [device for device in devices() if device != "hpu"]

    # torch.optim hides its `optimizer` module behind the class of that name
    for name in ("torch.utils._foreach_utils", "torch.optim.optimizer", "torch.optim.swa_utils"):
        importlib.import_module(name)._get_foreach_kernels_supported_devices = without_hpu


def _profiler_takes_hpu_activity() -> None:
    """torch's profiler takes a device named "hpu" for its HPU device type, profiled only where torch reports the HPU
    activity as supported, which it does for that type alone: where hpu is PrivateUse1, it reports HPU too, so that
    ``ProfilerActivity.HPU`` in Gaudi code (and ``PrivateUse1``, which torch profiles by the device's name) profiles
    hpu work instead of raising."""
    import torch.autograd.profiler
    import torch.profiler
    from torch.profiler import ProfilerActivity

    supported = torch.autograd._supported_activities

    def with_hpu() -> set:
        return supported() | {ProfilerActivity.HPU}

    # each module holds its own reference to torch's function
    for module in (torch.autograd, torch.autograd.profiler, torch.profiler):
        module._supported_activities = with_hpu


def _dtensor_random_ops_in_philox_context() -> None:
    """Where torch has ``run_dtensor_rng_op`` (2.13 has, 2.11 has not), DTensor runs a random op on the accelerator
    through it; it reads and
    writes the device's generator state as a philox (seed, offset) pair, as CUDA's is; a Gaudi's state is that pair
    only inside ``set_rng_ctx("philox")``, which torch enters for hpu on its other path (``_distribute_region``) and
    not on this one. Here torch's kernel runs inside that context."""
    from torch._C import DispatchKey
    from torch._prims import rng_prims

    if not hasattr(rng_prims, "run_dtensor_rng_op"):  # an older torch
        return
    op = rng_prims.run_dtensor_rng_op
    torch_kernel = op.py_kernels[DispatchKey.BackendSelect]
    del op.py_kernels[DispatchKey.BackendSelect]  # `py_impl` refuses a key that has a kernel

    def in_philox_context(*args: Any, **kwargs: Any) -> Any:
        from habana_frameworks.torch.hpu import random

        random.set_rng_ctx("philox")
        try:
            return torch_kernel(*args, **kwargs)
        finally:
            random.unset_rng_ctx("philox")

    op.py_impl(DispatchKey.BackendSelect)(in_philox_context)


def activate(
    devices: Optional[int] = None, generation: Optional[str] = None, memory_mb: Optional[int] = None
) -> Config:
    """Make ``hpu`` a torch device backed by host memory, for this process.

    Args:
        devices: number of devices (``VIRTUAL_HPU_DEVICES``, default 8, at most 16).
        generation: ``"GAUDI"``, ``"GAUDI2"`` or ``"GAUDI3"`` (``VIRTUAL_HPU_GENERATION``, default ``"GAUDI2"``).
        memory_mb: memory limit per device in MiB (``VIRTUAL_HPU_MEMORY_MB``, default: the generation's HBM).

    Returns:
        The active configuration. Calling again with no or the same settings returns it; other settings raise
        ``RuntimeError``, as the device cannot change within a process.

    Posing as a Gaudi image with stock PyTorch (``VIRTUAL_HPU_STOCK_PYTORCH=1``), lazy mode is refused as the bridge
    refuses it there, with its ``AssertionError``: such images run eager only.

    On a torch 2.9 or later built for another accelerator (``is_privateuse1()``, e.g. PyPI's CUDA build), hpu is torch's
    PrivateUse1 backend and, as torch has one accelerator, takes that place from the other device: in this process,
    backward passes over the other device's tensors (a GPU's, where the machine has one) fail. Activation is opt-in per
    process; use the GPU in another one. There, torch's optimizers keep Gaudi's per-tensor default on hpu, and its
    profiler reports the HPU activity, as on a Gaudi.
    """
    global _active
    wanted = resolve(devices, generation, memory_mb)
    # the first ``import torch`` runs its device-backend autoload, which may activate us (once) before we go on
    import torch

    if _active is not None:
        if wanted != _active and (devices, generation, memory_mb) != (None, None, None):
            raise RuntimeError(
                f"The virtual Gaudi is already active as {_active}; it cannot become {wanted} in this process. Set"
                " VIRTUAL_HPU_DEVICES, VIRTUAL_HPU_GENERATION or VIRTUAL_HPU_MEMORY_MB before the process imports torch"
                " (with VIRTUAL_HPU=1, `import torch` activates it)."
            )
        return _active
    _refuse_real_installation()
    check_bridge_loads(wanted)
    from virtual_hpu import _native, autocast, torch_support

    # before anything is compiled: outside the range the sources do not build, and a compiler log explains nothing
    torch_support.check_torch(torch.__version__, "The virtual Gaudi")
    _claim_privateuse1()

    _native.load_library()
    if is_privateuse1():
        # Gaudi's autocast default, which torch has for HPU; for PrivateUse1 it is float16. torch keeps it per thread:
        # another thread's `torch.autocast("hpu")` without a dtype gets float16.
        torch.set_autocast_dtype("hpu", torch.bfloat16)
        _optimizers_per_tensor_on_hpu()
        _profiler_takes_hpu_activity()
    _dtensor_random_ops_in_philox_context()
    ops = torch.ops.virtual_hpu
    ops.configure(wanted.devices, wanted.lazy)
    ops.set_torch_accelerator(is_torch_accelerator())
    for index in range(wanted.devices):
        ops.set_memory_limit(index, wanted.memory_mb * 1024 * 1024)
    ops.set_fp16_supported(wanted.fp16_supported)
    # Where the host CPU has no bf16/fp16 matrix instructions its own low-precision matmul is ~100x slower than fp32:
    # matrix products of those dtypes are then computed in fp32 and rounded once, as Gaudi's matrix engine does.
    ops.widen_low_precision_matmuls(
        not torch.ops.mkldnn._is_mkldnn_bf16_supported(), not torch.ops.mkldnn._is_mkldnn_fp16_supported()
    )
    # Work on the virtual device is synchronous: running backward on the calling thread, instead of handing every
    # backward pass to a device thread and back, saves two thread wake-ups per pass and matches CPU speed.
    torch.autograd.set_multithreading_enabled(False)
    _active = wanted
    # where Gaudi's software writes its logs, which it sets when unset and user code reads
    os.environ.setdefault("HABANA_LOGS", str(Path.home() / ".habana_logs"))
    _put_facade_on_path()
    import habana_frameworks.torch  # noqa: F401  (registers torch.hpu, as the real bridge does)

    autocast.set_op_lists_from_env()
    _announce(wanted)
    return wanted


def activate_from_env() -> bool:
    """Activate when ``VIRTUAL_HPU=1``; return whether the virtual Gaudi is active afterwards.

    Posing as an image with stock PyTorch in lazy mode, where the bridge refuses to load, the facade is only put on the
    path: importing ``habana_frameworks.torch`` then raises the bridge's error, as it does there.
    """
    flag = os.environ.get("VIRTUAL_HPU", "").strip()
    if flag not in ("", "0", "1"):
        raise ValueError(f"VIRTUAL_HPU must be 1 (on) or 0 (off), got {flag!r}")
    if flag == "1":
        wanted = resolve()
        if _active is None and wanted.lazy and wanted.stock_pytorch:
            _put_facade_on_path()
        else:
            activate()
    return _active is not None


def _put_facade_on_path() -> None:
    if str(_FACADE) not in sys.path:
        sys.path.insert(0, str(_FACADE))


def check_bridge_loads(config: Optional[Config] = None) -> None:
    """Raise the bridge's ``AssertionError`` where it refuses to load: lazy mode on an image with stock PyTorch (its
    ``habana_frameworks/torch/__init__.py`` in 1.24.0, in its words; 1.22 and 1.23 said "Stock PyTorch version ...").
    ``config`` defaults to the active one, or else the environment's."""
    config = config or _active or resolve()
    if config.lazy and config.stock_pytorch:
        import torch

        raise AssertionError(f"Upstream PyTorch version {torch.__version__} is not supported in Lazy mode.")


def _announce(config: Config) -> None:
    if not _log.hasHandlers():
        _log.addHandler(logging.StreamHandler())
        _log.setLevel(logging.INFO)
    mode = "lazy" if config.lazy else "eager"
    _log.info(
        f"Virtual Gaudi active: {config.devices} x {config.generation} (host memory), "
        f"{config.memory_mb} MiB per device, {mode} mode; not a real accelerator"
    )
