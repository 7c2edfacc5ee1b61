"""PyTorch's device-backend autoload: ``import torch`` activates the virtual Gaudi, as it loads the real bridge.

Current Gaudi software loads itself on ``import torch`` in eager mode (entry point group ``torch.backends``), so a
library that asks torch for its accelerator before anything of Gaudi's is imported (``transformers`` does) sees the
HPU. The virtual Gaudi does the same when ``VIRTUAL_HPU=1``, with the bridge's switches: ``PT_HPU_AUTOLOAD=0/1``
overrides the default, which is on in eager mode and off in lazy mode. PyTorch's ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
turns off every backend's autoload.

Where autoload is off, the bridge is still installed and a script loads it itself, as lazy-mode scripts do with
``import habana_frameworks.torch.core``: that import activates the virtual Gaudi then. On a Gaudi the bridge is
installed before any import, so a script may import it first, before torch: the project installs a start-up hook (a
``.pth`` file that does nothing unless ``VIRTUAL_HPU=1``) that calls ``at_startup`` for that.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Optional


def autoload() -> None:
    """Activate the virtual Gaudi when it is asked for and autoload applies; called by ``import torch``."""
    if os.environ.get("VIRTUAL_HPU", "").strip() != "1":
        return
    if _autoload_wanted():
        import virtual_hpu

        virtual_hpu.activate_from_env()
    else:
        _activate_on_import()


def at_startup() -> None:
    """Called when the interpreter starts with ``VIRTUAL_HPU=1``: a ``habana_frameworks`` import activates the virtual
    Gaudi, also as a script's first import (``import torch`` may still do so first, see ``autoload``)."""
    _activate_on_import()


def _activate_on_import() -> None:
    if not any(isinstance(finder, _ActivateOnImport) for finder in sys.meta_path):
        sys.meta_path.append(_ActivateOnImport())


def _autoload_wanted() -> bool:
    flag = os.environ.get("PT_HPU_AUTOLOAD", "").strip()
    if flag not in ("", "0", "1"):
        raise ValueError(f"PT_HPU_AUTOLOAD must be 1 (load on `import torch`) or 0 (do not), got {flag!r}")
    if flag:
        return flag == "1"
    return os.environ.get("PT_HPU_LAZY_MODE", "0").strip() != "1"


class _ActivateOnImport(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: a ``habana_frameworks`` import that nothing else can satisfy activates the virtual
    Gaudi, which puts its facade on the path, and is then found there."""

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != "habana_frameworks":
            return None
        sys.meta_path.remove(self)
        import virtual_hpu

        virtual_hpu.activate_from_env()
        return importlib.util.find_spec(fullname)
