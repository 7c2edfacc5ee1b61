"""The process-wide state a test must leave as it found it: the environment, the default process group, and torch's
global settings.

A leak changes what later tests in the same process see, so the suite's outcome would depend on its order (and on
how pytest-xdist happens to share the files between workers). ``tests/conftest.py`` takes a ``snapshot`` before every
test and calls ``restore`` after it, which puts back what the test changed and names what the test left changed.

torch is imported when the first snapshot is taken, not with this module: the conftests decide ``OMP_NUM_THREADS``
and ``VIRTUAL_HPU`` before anything imports torch.
"""

import functools
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

# Variables a test may leave changed without it being the test's fault: each is set by a library, by design, for the
# rest of the process. They are put back all the same. A test's own variables belong in ``monkeypatch.setenv``.
ALLOWED_ENVIRONMENT_CHANGES = {
    # Lightning's subprocess-script launcher (every DDP-family strategy: ours, DeepSpeed, FSDP) writes the rendezvous
    # and this process's ranks into the launching process when a run starts, and leaves them there (all but
    # WORLD_SIZE): later runs of the same script belong to the ranks it started and must not launch again
    "MASTER_ADDR": "Lightning's launcher, for later runs in the process",
    "MASTER_PORT": "Lightning's launcher, for later runs in the process",
    "NODE_RANK": "Lightning's launcher, for later runs in the process",
    "LOCAL_RANK": "Lightning's launcher, for later runs in the process",
    "RANK": "Lightning's DeepSpeed strategy, for deepspeed.init_distributed, with the launcher's",
    # ``seed_everything`` (which LightningCLI calls unless told not to) records the seed for the processes a run starts
    # and their data-loader workers: its documented effect
    "PL_GLOBAL_SEED": "seed_everything, for the ranks and workers a run starts",
    "PL_SEED_WORKERS": "seed_everything, for the ranks and workers a run starts",
    # when unset, Lightning's launchers give the launching process its share of the cores, with torch's thread count
    # to match (forgiven below), for the rest of the process; a pytest-xdist worker has it set already (conftest.py)
    "OMP_NUM_THREADS": "Lightning's launchers, the launching process's share of the cores",
    # torch records where inductor keeps its caches once one is needed; torch 2.6 does on the first torch.compile,
    # whatever the backend (its compiler bisector asks on import)
    "TORCHINDUCTOR_CACHE_DIR": "torch, inductor's cache directory for the rest of the process",
}

# pytest's own record of the running test and phase, which it sets and removes itself: neither compared nor put back
_PYTEST_VARIABLE = "PYTEST_CURRENT_TEST"

# DeepSpeed's HPU accelerator is created once per process, when ``deepspeed`` is first imported with
# ``habana_frameworks`` importable (or by our ``use_deepspeed_hpu_accelerator``), and then sets these for the rest of
# the process: Gaudi bridge workarounds in the environment, deterministic algorithms on and uninitialized memory no
# longer filled. Whichever test imports DeepSpeed first would be blamed, so they are forgiven in the test during which
# that accelerator came into being (and only then), and put back like any other change.
DEEPSPEED_ACCELERATOR_CHANGES = (
    "PT_HPU_LAZY_ACC_PAR_MODE",
    "PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES",
    "deterministic algorithms (enabled, warn_only)",
    "fill_uninitialized_memory",
)


@dataclass(frozen=True)
class _Setting:
    read: Callable[[], Any]
    write: Callable[[Any], None]


@functools.cache
def torch_settings() -> dict[str, _Setting]:
    """torch's process-wide settings, each named as a test's author would look for it, read and restored."""
    import torch
    import torch.utils.deterministic

    def deterministic() -> tuple[bool, bool]:
        return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()

    def set_deterministic(value: tuple[bool, bool]) -> None:
        torch.use_deterministic_algorithms(value[0], warn_only=value[1])

    def set_default_device(device: Any) -> None:
        # ``None`` is torch's own default; setting "cpu" would install a device context that was not there before
        torch.set_default_device(None if device == torch.device("cpu") else device)

    def autocast(device_type: str) -> _Setting:
        def write(value: tuple[bool, Any]) -> None:
            torch.set_autocast_enabled(device_type, value[0])
            torch.set_autocast_dtype(device_type, value[1])

        return _Setting(lambda: (torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)), write)

    def python_dispatcher() -> _Setting:
        # on, Python decompositions replace composite ops in eager mode too (autocast then sees their pieces)
        key = torch._C.DispatchKey.PythonDispatcher
        return _Setting(
            lambda: torch._C._dispatch_tls_is_dispatch_key_included(key),
            lambda value: torch._C._dispatch_tls_set_dispatch_key_included(key, value),
        )

    def attribute(owner: Any, name: str) -> _Setting:
        return _Setting(lambda: getattr(owner, name), lambda value: setattr(owner, name, value))

    return {
        "default dtype": _Setting(torch.get_default_dtype, torch.set_default_dtype),
        "default device": _Setting(torch.get_default_device, set_default_device),
        "grad mode": _Setting(torch.is_grad_enabled, torch.set_grad_enabled),
        "deterministic algorithms (enabled, warn_only)": _Setting(deterministic, set_deterministic),
        "fill_uninitialized_memory": attribute(torch.utils.deterministic, "fill_uninitialized_memory"),
        "anomaly detection (enabled, check_nan)": _Setting(
            lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
            lambda value: torch.autograd.set_detect_anomaly(*value),
        ),
        "cpu autocast (enabled, dtype)": autocast("cpu"),
        "hpu autocast (enabled, dtype)": autocast("hpu"),
        "number of threads": _Setting(torch.get_num_threads, torch.set_num_threads),
        "python dispatcher (torch._dispatch.python.enable_python_dispatcher)": python_dispatcher(),
        "float32 matmul precision": _Setting(torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        # what ``Trainer(benchmark=..., deterministic=...)`` sets
        "torch.backends.cudnn.benchmark": attribute(torch.backends.cudnn, "benchmark"),
        "torch.backends.cudnn.deterministic": attribute(torch.backends.cudnn, "deterministic"),
    }


@dataclass(frozen=True)
class Snapshot:
    environment: dict[str, str]
    process_group: bool
    torch_settings: dict[str, Any]
    deepspeed_accelerator: Any  # held, so that a newly created accelerator is a different object


def _process_group_initialized() -> bool:
    import torch.distributed

    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _deepspeed_accelerator() -> Any:
    # looked up, not imported: importing DeepSpeed is what creates its accelerator
    return getattr(sys.modules.get("deepspeed.accelerator.real_accelerator"), "ds_accelerator", None)


def _import_libraries_that_set_the_environment() -> None:
    """scikit-learn sets ``KMP_DUPLICATE_LIB_OK`` and ``KMP_INIT_AT_FORK`` for the process when it is first imported;
    imported before the snapshot, so whichever test imports it first is not blamed for them."""
    import importlib.util

    if "sklearn" not in sys.modules and importlib.util.find_spec("sklearn") is not None:
        import sklearn  # noqa: F401


def snapshot() -> Snapshot:
    # torch first: its first import activates the virtual Gaudi, which sets variables (HABANA_LOGS) as Gaudi's
    # software does, for the process; they belong to no test
    settings = {name: setting.read() for name, setting in torch_settings().items()}
    _import_libraries_that_set_the_environment()
    return Snapshot(
        environment={name: value for name, value in os.environ.items() if name != _PYTEST_VARIABLE},
        process_group=_process_group_initialized(),
        torch_settings=settings,
        deepspeed_accelerator=_deepspeed_accelerator(),
    )


def restore(before: Snapshot) -> list[str]:
    """Put back the state of ``before``; return what had been left changed since, one line each with the fix."""
    after = snapshot()
    forgiven = _forgiven(before, after)
    leaks = []

    if after.process_group and not before.process_group:
        import torch.distributed

        torch.distributed.destroy_process_group()
        leaks.append(
            "the default process group is still initialized: destroy it in a `finally:` block"
            " (`torch.distributed.destroy_process_group()`), or run the ranks in subprocesses"
        )

    for name in sorted(before.environment.keys() | after.environment.keys()):
        old, new = before.environment.get(name), after.environment.get(name)
        if old != new and name not in forgiven:
            leaks.append(
                f"environment variable {name}: {_value(old)} before, {_value(new)} after: set it with"
                " `monkeypatch.setenv` / `monkeypatch.delenv`, which undo it after the test"
            )
    for name in after.environment.keys() - before.environment.keys():
        del os.environ[name]
    os.environ.update(before.environment)

    for name, setting in torch_settings().items():
        old, new = before.torch_settings[name], after.torch_settings[name]
        if old == new:
            continue
        setting.write(old)
        if name not in forgiven:
            leaks.append(
                f"torch's {name}: {old!r} before, {new!r} after: change it in a context manager, or put it back in a"
                " `finally:` block or a fixture's teardown"
            )
    return leaks


def _forgiven(before: Snapshot, after: Snapshot) -> set[str]:
    """The names of the changes between ``before`` and ``after`` that are a library's doing, by design."""
    forgiven = set(ALLOWED_ENVIRONMENT_CHANGES)
    accelerator = after.deepspeed_accelerator
    if accelerator is not None and accelerator is not before.deepspeed_accelerator:
        forgiven.update(DEEPSPEED_ACCELERATOR_CHANGES)
    threads = after.environment.get("OMP_NUM_THREADS")
    if "OMP_NUM_THREADS" not in before.environment and threads == str(after.torch_settings["number of threads"]):
        forgiven.add("number of threads")  # set together with OMP_NUM_THREADS by Lightning's launchers
    return forgiven


def describe(test: str, leaks: list[str]) -> str:
    return f"{test} left the process changed (put back now, so later tests are not affected):\n" + "\n".join(
        f"  - {leak}" for leak in leaks
    )


def _value(value: Optional[str]) -> str:
    return "unset" if value is None else repr(value)
