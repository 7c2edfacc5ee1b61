"""The build cache: a build killed half-way (and torch's lock file it leaves) never blocks a later build."""

from pathlib import Path

import pytest
import torch.utils.cpp_extension

import virtual_hpu
from virtual_hpu import _native


def test_stale_scratch_and_lock_are_discarded(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    library = _native._library_path()
    assert library.is_relative_to(tmp_path) and library.name == "virtual_hpu_core.so"
    scratch = library.parent.with_name(library.parent.name + ".build")
    scratch.mkdir(parents=True)
    (scratch / "lock").write_text("")  # what a killed torch build leaves behind: later builds would wait forever
    library.parent.mkdir()
    calls = []

    def fake_load(name, sources, build_directory, **kwargs):
        assert not (Path(build_directory) / "lock").exists()
        assert {Path(s).name for s in sources} >= {"device.cpp", "fallback.cpp", "allocator.cpp"}
        calls.append(name)
        built = Path(build_directory) / f"{name}.so"
        built.write_bytes(b"library")
        return str(built)

    monkeypatch.setattr(torch.utils.cpp_extension, "load", fake_load)
    _native._build(library)
    assert calls == ["virtual_hpu_core"]
    assert library.read_bytes() == b"library"
    assert not scratch.exists()


def test_a_build_with_another_accelerator_has_its_own_library(tmp_path, monkeypatch):
    """There the device is compiled as torch's PrivateUse1 backend: a flag, part of the cache key."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(virtual_hpu, "is_privateuse1", lambda: False)
    hpu_flags, hpu_library = _native._cflags(), _native._library_path()
    monkeypatch.setattr(virtual_hpu, "is_privateuse1", lambda: True)
    assert "-DVIRTUAL_HPU_PRIVATEUSE1" not in hpu_flags
    assert "-DVIRTUAL_HPU_PRIVATEUSE1" in _native._cflags()
    assert _native._library_path() != hpu_library


@pytest.mark.parametrize(
    ("built_for", "version", "privateuse1"),
    [(None, "2.13.0+cpu", False), ("cuda", "2.6.0+cu124", False), ("cuda", "2.8.0", False), ("cuda", "2.9.0", True)],
)
def test_the_device_is_privateuse1_on_builds_for_another_accelerator_from_torch_2_9(
    monkeypatch, built_for, version, privateuse1
):
    """Before 2.9 the string "hpu" always named torch's HPU device type: a PrivateUse1 backend renamed so was out of
    reach, and the virtual Gaudi keeps the HPU device type on every build."""
    monkeypatch.setattr(virtual_hpu, "other_accelerator", lambda: built_for)
    monkeypatch.setattr(torch, "__version__", version)
    assert virtual_hpu.is_privateuse1() is privateuse1
