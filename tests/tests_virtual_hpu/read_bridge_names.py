"""Read the public names of a module of Intel's bridge, with their parameters, into ``bridge_names.json``'s form.

Run on a checkout of ``HabanaAI/gaudi-pytorch-bridge`` at the commit of one of the JSON's ``sources``; it parses the
source with ``ast``
(nothing of the bridge is imported or copied)::

    python tests/tests_virtual_hpu/read_bridge_names.py BRIDGE_CHECKOUT habana_frameworks.torch.hpex.optimizers ...

and prints each module's entry, its ``not_provided`` left empty for the reasons to be written by hand, as is its
``read_from`` (the version of that source). Newer bridges are published as single files only (the search index's):
an entry read from one of them by hand says so in ``sources``.
"""

import ast
import json
import sys
from pathlib import Path
from typing import Optional


def _default(node: Optional[ast.expr]) -> Optional[str]:
    return None if node is None else ast.unparse(node)


def _parameters(function: ast.FunctionDef, drop: int) -> list:
    arguments = function.args
    positional = arguments.posonlyargs + arguments.args
    defaults = [None] * (len(positional) - len(arguments.defaults)) + list(arguments.defaults)
    kinds = ["POSITIONAL_ONLY"] * len(arguments.posonlyargs) + ["POSITIONAL_OR_KEYWORD"] * len(arguments.args)
    described = [[a.arg, kind, _default(d)] for a, kind, d in zip(positional, kinds, defaults)]
    if arguments.vararg:
        described.append([arguments.vararg.arg, "VAR_POSITIONAL", None])
    described += [[a.arg, "KEYWORD_ONLY", _default(d)] for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults)]
    if arguments.kwarg:
        described.append([arguments.kwarg.arg, "VAR_KEYWORD", None])
    return described[drop:]


def _method(cls: ast.ClassDef, name: str) -> Optional[ast.FunctionDef]:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _describe(node: ast.AST) -> dict:
    if isinstance(node, ast.FunctionDef):
        return {"kind": "function", "parameters": _parameters(node, 0)}
    if isinstance(node, ast.ClassDef):
        if any(ast.unparse(base).endswith("autograd.Function") for base in node.bases):
            forward = _method(node, "forward")
            return {"kind": "autograd.Function", "parameters": forward and _parameters(forward, 1)}
        init = _method(node, "__init__")
        return {"kind": "class", "parameters": init and _parameters(init, 1)}
    return {"kind": "value", "parameters": None}


def _definitions(path: Path) -> dict:
    tree = ast.parse(path.read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node
        elif isinstance(node, ast.ImportFrom) and (node.level == 1 or node.module.startswith("habana_frameworks")):
            root = path.parent if node.level else next(p for p in path.parents if p.name == "python_packages")
            source = root / f"{node.module.replace('.', '/')}.py"
            inner = _definitions(source) if source.exists() else {}
            for alias in node.names:
                found[alias.asname or alias.name] = inner.get(alias.name, ast.Pass())
    return found


def read_module(checkout: Path, module: str) -> dict:
    base = checkout / "python_packages" / Path(*module.split("."))
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    names = {name: _describe(node) for name, node in _definitions(path).items() if not name.startswith("_")}
    return {"names": dict(sorted(names.items())), "not_provided": {}}


if __name__ == "__main__":
    checkout = Path(sys.argv[1])
    print(json.dumps({module: read_module(checkout, module) for module in sys.argv[2:]}, indent=1))
