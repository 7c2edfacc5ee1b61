"""Serve upstream ``lightning`` modules under the ``pytorch_lightning`` and ``lightning_fabric`` names.

We own only the modules that HPU support extends. Every other submodule path (``pytorch_lightning.strategies.ddp``,
``pytorch_lightning.utilities.rank_zero``, ...) resolves to the upstream module object itself, so there is one copy of
each module and ``isinstance`` checks, registries and module-level state are shared with upstream.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Optional, Sequence

# alias prefix -> upstream prefix
_ALIASES = {
    "pytorch_lightning": "lightning.pytorch",
    "lightning_fabric": "lightning.fabric",
}


def _upstream_name(fullname: str) -> Optional[str]:
    for alias, upstream in _ALIASES.items():
        if fullname.startswith(alias + "."):
            return upstream + fullname[len(alias) :]
    return None


class _UpstreamModuleLoader(importlib.abc.Loader):
    """Hands out the already imported upstream module instead of executing a second copy."""

    def __init__(self, upstream_name: str) -> None:
        self._upstream_name = upstream_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self._upstream_name)
        self._upstream_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system stamps our alias spec onto the module; the upstream module keeps its own identity
        module.__spec__ = self._upstream_spec


class _UpstreamAliasFinder(importlib.abc.MetaPathFinder):
    """Resolves a submodule of an aliased package to upstream unless one of our own packages ships it."""

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        upstream_name = _upstream_name(fullname)
        if upstream_name is None:
            return None
        parent = sys.modules.get(fullname.rpartition(".")[0])
        if parent is not None and _is_own_package(parent):
            own = importlib.machinery.PathFinder.find_spec(fullname, parent.__path__)
            if own is not None:
                return own
        try:
            upstream_spec = importlib.util.find_spec(upstream_name)
        except ImportError:
            return None
        if upstream_spec is None and upstream_name not in sys.modules:
            return None
        return importlib.machinery.ModuleSpec(fullname, _UpstreamModuleLoader(upstream_name))


def _is_own_package(module: ModuleType) -> bool:
    spec = getattr(module, "__spec__", None)
    return spec is not None and spec.name == module.__name__ and _upstream_name(module.__name__ + ".x") is not None


def install() -> None:
    """Put the alias finder first on ``sys.meta_path`` (idempotent).

    It must precede the path-based finder: an aliased package carries upstream's ``__path__``, and the path finder
    would otherwise execute a second copy of an upstream file under our name.
    """
    if not any(isinstance(finder, _UpstreamAliasFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _UpstreamAliasFinder())


def extend_upstream(module_name: str, upstream: ModuleType) -> None:
    """Make one of our own packages re-export everything its upstream counterpart has.

    Names we define win; anything else is looked up on the upstream module, so nothing is listed by hand.
    """
    module = sys.modules[module_name]
    own_all = list(getattr(module, "__all__", []))
    module.__all__ = own_all + [name for name in getattr(upstream, "__all__", []) if name not in own_all]

    def __getattr__(name: str) -> object:
        value = getattr(upstream, name, None)
        is_submodule = isinstance(value, ModuleType) and value.__name__ == f"{upstream.__name__}.{name}"
        if value is not None and not is_submodule:
            return value
        if "__path__" in vars(module) and not name.startswith("__"):
            # a submodule goes through the import system, which picks our own package where we have one
            try:
                return importlib.import_module(f"{module_name}.{name}")
            except ModuleNotFoundError:
                pass
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    module.__getattr__ = __getattr__  # type: ignore[method-assign]

    def __dir__() -> list:
        return sorted(set(vars(module)) | set(dir(upstream)))

    module.__dir__ = __dir__  # type: ignore[method-assign]
