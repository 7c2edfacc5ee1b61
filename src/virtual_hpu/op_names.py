"""Op names as Gaudi's autocast lists take them: aten op names, and the names of Habana's published default lists and
of Lightning 1.x / HMP op files that are not aten names (``truediv``, ``cross_entropy``, ...).

Importing it activates nothing: the HPU precision plugin validates users' op-list files with it on any machine.
"""

import difflib
from collections.abc import Iterable
from functools import lru_cache

import torch

# names Gaudi users have in their lists -> the aten op autocast sees
ALIASES = {"cross_entropy": "cross_entropy_loss", "truediv": "div", "floordiv": "floor_divide"}


def overloads(name: str) -> list[str]:
    """The functional overloads of aten op ``name`` (``"div"``, ``"div.Tensor_mode"``, ...); none if there is none."""
    if not hasattr(torch.ops.aten, name):
        return []
    packet = getattr(torch.ops.aten, name)
    found = []
    for overload in packet.overloads():
        schema = getattr(packet, overload)._schema
        if not any(argument.is_out for argument in schema.arguments):
            found.append(name if overload == "default" else f"{name}.{overload}")
    return found


@lru_cache(maxsize=1)
def _known_names() -> tuple[str, ...]:
    qualified = torch._C._dispatch_get_all_op_names()
    names = {name[len("aten::") :].split(".")[0] for name in qualified if name.startswith("aten::")}
    return tuple(sorted(name for name in names if not name.startswith("_")))


def resolve(names: Iterable[str], source: str) -> tuple[str, ...]:
    """The aten op names ``names`` stand for, in order and without repeats; ``ValueError`` naming the closest valid
    names for any name that is neither an aten op nor a known alias."""
    resolved, unknown = [], []
    for name in (n.strip() for n in names):
        if not name or name.startswith("#"):
            continue
        target = ALIASES.get(name, name)
        if overloads(target):
            resolved.append(target)
        else:
            unknown.append(name)
    if unknown:
        candidates = _known_names() + tuple(ALIASES)
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
            hints.append(f"{name!r}" + (f" (did you mean {', '.join(map(repr, close))}?)" if close else ""))
        raise ValueError(
            f"{source} names ops that do not exist: {'; '.join(hints)}. Use aten op names such as 'linear', 'matmul'"
            " or 'softmax'."
        )
    return tuple(dict.fromkeys(resolved))
