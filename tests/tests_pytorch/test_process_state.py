"""The check that every test leaves the process as it found it (``tests/process_state.py``, applied to every test by
``tests/conftest.py``) catches each kind of leak, names it with its fix, and puts the state back."""

import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
import torch.distributed

import process_state

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def nondeterministic():
    """Deterministic algorithms off for the test, as in a fresh process: a worker that collected a module importing
    DeepSpeed with the Gaudi software importable has them on for good (DeepSpeed's HPU accelerator sets them)."""
    state = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.delenv("PT_HPU_LAZY_ACC_PAR_MODE", raising=False)  # set by the same accelerator
    yield
    monkeypatch.undo()
    torch.use_deterministic_algorithms(state[0], warn_only=state[1])


def test_environment_leaks_are_named_and_undone(monkeypatch):
    monkeypatch.setenv("LEAK_CHANGED", "before")
    monkeypatch.setenv("LEAK_REMOVED", "there")
    before = process_state.snapshot()
    os.environ["LEAK_ADDED"] = "1"
    os.environ["LEAK_CHANGED"] = "after"
    del os.environ["LEAK_REMOVED"]

    leaks = process_state.restore(before)

    assert len(leaks) == 3, leaks
    assert leaks[0].startswith("environment variable LEAK_ADDED: unset before, '1' after")
    assert leaks[1].startswith("environment variable LEAK_CHANGED: 'before' before, 'after' after")
    assert leaks[2].startswith("environment variable LEAK_REMOVED: 'there' before, unset after")
    assert all("monkeypatch.setenv" in leak for leak in leaks)
    assert "LEAK_ADDED" not in os.environ
    assert os.environ["LEAK_CHANGED"] == "before"
    assert os.environ["LEAK_REMOVED"] == "there"
    assert process_state.restore(process_state.snapshot()) == []


def test_torch_setting_leaks_are_named_and_undone(nondeterministic):
    before = process_state.snapshot()
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_float32_matmul_precision("medium")
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)

    leaks = process_state.restore(before)

    named = [leak.split(":")[0] for leak in leaks]
    assert named == [
        "torch's default dtype",
        "torch's grad mode",
        "torch's deterministic algorithms (enabled, warn_only)",
        "torch's number of threads",
        "torch's float32 matmul precision",
    ]
    assert "torch.float32 before, torch.float64 after" in leaks[0]
    assert "finally:" in leaks[0]
    assert torch.get_default_dtype() == torch.float32
    assert torch.is_grad_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.get_float32_matmul_precision() == before.torch_settings["float32 matmul precision"]
    assert torch.get_num_threads() == threads


def test_the_python_dispatcher_left_on_is_named_and_turned_off():
    """Left on, it has eager hpu ops run as Python decompositions, whose pieces autocast casts (a bilinear
    ``interpolate`` then computed in bf16 under ``torch.autocast("hpu")``)."""
    before = process_state.snapshot()
    guard = torch._C._EnablePythonDispatcher()

    leaks = process_state.restore(before)

    assert [leak.split(":")[0] for leak in leaks] == [
        "torch's python dispatcher (torch._dispatch.python.enable_python_dispatcher)"
    ]
    assert not torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.PythonDispatcher)
    del guard


def test_a_process_group_left_initialized_is_named_and_destroyed():
    before = process_state.snapshot()
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)

    leaks = process_state.restore(before)

    assert len(leaks) == 1
    assert leaks[0].startswith("the default process group is still initialized: destroy it in a `finally:` block")
    assert not torch.distributed.is_initialized()


def test_deepspeed_accelerator_settings_are_forgiven_only_in_the_test_that_creates_it(monkeypatch, nondeterministic):
    module = types.SimpleNamespace(ds_accelerator=None)  # as DeepSpeed's before its accelerator is created
    monkeypatch.setitem(sys.modules, "deepspeed.accelerator.real_accelerator", module)

    before = process_state.snapshot()
    module.ds_accelerator = object()  # created now, with what DeepSpeed's HPU accelerator does on creation
    torch.use_deterministic_algorithms(True)
    os.environ["PT_HPU_LAZY_ACC_PAR_MODE"] = "0"
    assert process_state.restore(before) == []
    assert not torch.are_deterministic_algorithms_enabled()  # put back all the same
    assert "PT_HPU_LAZY_ACC_PAR_MODE" not in os.environ

    before = process_state.snapshot()  # a later test, with the accelerator already there
    torch.use_deterministic_algorithms(True)
    os.environ["PT_HPU_LAZY_ACC_PAR_MODE"] = "0"
    leaks = process_state.restore(before)
    assert [leak.split(":")[0] for leak in leaks] == [
        "environment variable PT_HPU_LAZY_ACC_PAR_MODE",
        "torch's deterministic algorithms (enabled, warn_only)",
    ]


def test_a_launchers_share_of_the_cores_is_forgiven_with_its_variable(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # as outside pytest-xdist
    threads = torch.get_num_threads()
    before = process_state.snapshot()
    # what Lightning's launchers do when OMP_NUM_THREADS is unset: both, for the rest of the process
    os.environ["OMP_NUM_THREADS"] = str(threads + 1)
    torch.set_num_threads(threads + 1)
    assert process_state.restore(before) == []
    assert torch.get_num_threads() == threads
    assert "OMP_NUM_THREADS" not in os.environ


def test_the_suite_fails_a_leaking_test_by_name(tmp_path):
    """End to end: ``tests/conftest.py`` as the plugin of a pytest run of a test that leaks, one that uses monkeypatch,
    and one that runs after the leak."""
    (tmp_path / "test_leaky.py").write_text(
        textwrap.dedent(
            """
            import os

            def test_leaks():
                os.environ["LEAKED_BY_TEST"] = "1"

            def test_uses_monkeypatch(monkeypatch):
                monkeypatch.setenv("SET_BY_MONKEYPATCH", "1")

            def test_sees_no_leak():
                assert "LEAKED_BY_TEST" not in os.environ
            """
        )
    )
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "PYTHONPATH": path}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest", "test_leaky.py"]
    result = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)

    # warnings, if any, are counted between the two (markers of this suite are unknown to that run's configuration)
    assert re.search(r"\b3 passed, (\d+ warnings?, )?1 error\b", result.stdout), result.stdout + result.stderr
    assert "ERROR at teardown of test_leaks" in result.stdout
    assert "test_leaky.py::test_leaks left the process changed" in result.stdout
    assert "environment variable LEAKED_BY_TEST: unset before, '1' after" in result.stdout
