"""Build (once, cached on disk) and load the C++ part of the virtual Gaudi.

The library is compiled with ``torch.utils.cpp_extension`` the first time a process activates the device,
into ``$TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``) under a directory named after the
torch version and a hash of the sources and flags, and simply loaded by every later process. On a torch built for
another accelerator the device is compiled as torch's PrivateUse1 backend instead of its HPU device type (see
``csrc/virtual_hpu.h``): another flag, so another library.
"""

import fcntl
import hashlib
import os
import shutil
from pathlib import Path

import torch

_NAME = "virtual_hpu_core"
_CSRC = Path(__file__).parent / "csrc"
_loaded = False


def _cflags() -> list[str]:
    from virtual_hpu import is_privateuse1

    return ["-O2", "-DVIRTUAL_HPU_PRIVATEUSE1"] if is_privateuse1() else ["-O2"]


def _sources() -> list[Path]:
    return sorted(_CSRC.glob("*.cpp"))


def _build_root() -> Path:
    if "TORCH_EXTENSIONS_DIR" in os.environ:
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "torch_extensions"


def _library_path() -> Path:
    digest = hashlib.sha256(torch.__version__.encode() + repr(_cflags()).encode())
    for path in sorted(_CSRC.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    return _build_root() / f"virtual_hpu-{torch.__version__}-{digest.hexdigest()[:16]}" / f"{_NAME}.so"


def _build(library: Path) -> None:
    """Compile into a scratch directory and move the finished library into place.

    The caller holds an exclusive ``fcntl`` lock, which the kernel drops when a process dies, so no stale lock can
    block a later build; a scratch directory left by a killed build (including torch's own lock file) is discarded.
    """
    from torch.utils.cpp_extension import load

    scratch = library.parent.with_name(library.parent.name + ".build")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    built = load(
        name=_NAME,
        sources=[str(s) for s in _sources()],
        extra_cflags=_cflags(),
        build_directory=str(scratch),
        is_python_module=False,
        verbose=os.environ.get("VIRTUAL_HPU_VERBOSE_BUILD") == "1",
    )
    os.replace(built, library)
    shutil.rmtree(scratch, ignore_errors=True)


def load_library() -> None:
    """Load the compiled library into this process, building it first if no process has yet."""
    global _loaded
    if _loaded:
        return
    library = _library_path()
    if not library.exists():
        library.parent.mkdir(parents=True, exist_ok=True)
        with open(library.parent.with_name(library.parent.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not library.exists():
                _build(library)
    torch.ops.load_library(str(library))
    _loaded = True
