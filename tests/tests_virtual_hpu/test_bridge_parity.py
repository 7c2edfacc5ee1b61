"""The facade offers the names of the bridge's Python modules, with the bridge's signatures.

``bridge_names.json`` holds, for each ``habana_frameworks.torch`` module the facade provides, the public names of
the bridge's module and their parameters, as read from the bridge's source (each module names the version it was read
from, whose commit the file gives),
and the names the virtual Gaudi does not provide, each with the reason. A name of the bridge that is neither in the
facade nor listed as not provided, or a signature that differs in parameter names, kinds or defaults, fails here.
"""

import ast
import importlib
import inspect
import json
from pathlib import Path
from typing import Any, Optional

import pytest
import torch
from torch.optim.optimizer import required

BRIDGE = json.loads((Path(__file__).parent / "bridge_names.json").read_text())
MODULES = BRIDGE["modules"]
_NO_DEFAULT = object()


def _parameters(obj: Any, kind: str) -> Optional[list]:
    """``[name, kind, default]`` of what the bridge's signature describes, for the facade's ``obj``."""
    if kind == "autograd.Function":
        function = obj.forward if "forward" in vars(obj) else obj.apply
        drop = 1 if "forward" in vars(obj) else 0  # forward takes ctx first, like the bridge's
    elif kind == "class":
        function, drop = obj.__init__, 1
    else:
        function, drop = obj, 0
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    return [
        [p.name, p.kind.name, _NO_DEFAULT if p.default is inspect.Parameter.empty else p.default]
        for p in list(signature.parameters.values())[drop:]
    ]


def _same_default(ours: Any, theirs: Optional[str]) -> bool:
    if theirs is None:
        return ours is _NO_DEFAULT
    if theirs == "required":  # torch's sentinel for an optimizer argument without a default
        return ours is required
    try:
        return ours == ast.literal_eval(theirs)
    except ValueError:  # an expression (an enum member, a constant): compare its spelling
        return theirs.endswith(getattr(ours, "name", repr(ours)))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_the_facade_has_every_name_of_the_bridges_module(module):
    facade = importlib.import_module(module)
    entry = MODULES[module]
    missing = [name for name in entry["names"] if name not in entry["not_provided"] and not hasattr(facade, name)]
    assert entry["read_from"] in BRIDGE["sources"], f"{module} names no source the file describes"
    assert not missing, f"{module} lacks {missing} of bridge {entry['read_from']}"
    stale = [name for name in entry["not_provided"] if name not in entry["names"] or hasattr(facade, name)]
    assert not stale, f"{module}: {stale} are listed as not provided, but are provided or not the bridge's"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_the_facades_signatures_are_the_bridges(module):
    facade = importlib.import_module(module)
    differences = []
    for name, described in MODULES[module]["names"].items():
        if described["parameters"] is None or not hasattr(facade, name):
            continue
        ours = _parameters(getattr(facade, name), described["kind"])
        if ours is None:
            continue
        theirs = described["parameters"]
        same = len(ours) == len(theirs) and all(
            o[0] == t[0] and o[1] == t[1] and _same_default(o[2], t[2]) for o, t in zip(ours, theirs)
        )
        if not same:
            differences.append(f"{name}: ours {[o[:2] + [o[2] if o[2] is not _NO_DEFAULT else '-'] for o in ours]}"
                               f" the bridge's {theirs}")  # fmt: skip
    assert not differences, f"{module}:\n" + "\n".join(differences)


def test_names_not_modelled_fail_when_called_not_when_imported():
    import habana_frameworks.torch.hpu as hthpu
    import habana_frameworks.torch.utils.debug as htdebug

    with pytest.raises(NotImplementedError, match="not model"):
        hthpu.utilization()
    with pytest.raises(NotImplementedError, match="does not model"):
        htdebug._memstat_livealloc("step")
    assert htdebug._get_fallback_op_count() == {}
    htdebug._enable_fuse_conv_bn_optimization(False)  # a compiler pass: accepted, no effect on results


def test_typed_tensor_constructors_make_hpu_tensors():
    import habana_frameworks.torch.hpu as hthpu

    tensor = hthpu.BFloat16Tensor([1.0, 2.5])
    assert tensor.device.type == "hpu" and tensor.dtype == torch.bfloat16
    assert tensor.cpu().tolist() == [1.0, 2.5]
    with pytest.raises(RuntimeError, match="makes torch.float32 tensors, got dtype=torch.int32"):
        hthpu.FloatTensor([1], dtype=torch.int32)


def test_enable_compiled_autograd_compiles_the_backward_with_hpu_backend(python):
    result = python(
        """
        import torch
        import habana_frameworks.torch.core
        from habana_frameworks.torch.dynamo.compile_backend.experimental import enable_compiled_autograd
        from torch._dynamo.utils import counters

        enable_compiled_autograd()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        reference.load_state_dict(model.state_dict())
        compiled = torch.compile(model.to("hpu"), backend="hpu_backend")
        x = torch.randn(5, 4)
        compiled(x.to("hpu")).sum().backward()
        reference(x).sum().backward()
        for ours, theirs in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(ours.grad.cpu(), theirs.grad)
        # every backward pass is captured from now on, the compiled model's and the CPU reference's
        assert counters["compiled_autograd"]["captures"] == 2, dict(counters["compiled_autograd"])
        print("ok")
        """,
        VIRTUAL_HPU="1",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")
