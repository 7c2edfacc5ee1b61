"""Notice of each host sync and each graph compilation as it happens, for tools that tell users where they come from.

The C++ counters (``virtual_hpu.accounting``) say how many; a listener subscribed here is called at the moment of
the event, so it can look at the Python stack that caused it. Host syncs and lazy-mode compilations come from C++
through the op ``virtual_hpu::event``, implemented here; ``torch.compile`` compilations come from ``hpu_backend``
with the graph. Nothing is reported while no one listens.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch

from virtual_hpu._config import refuse_as_hardware
from virtual_hpu.compilation import CompiledGraph

HOST_SYNC, COMPILATION = "host_sync", "compilation"


@dataclass(frozen=True)
class Event:
    """A host sync or a graph compilation; ``graph`` describes a graph ``hpu_backend`` compiled (None in lazy mode)."""

    kind: str
    graph: Optional[CompiledGraph] = None


Listener = Callable[[Event], None]
_listeners: list[Listener] = []
_library: Optional[torch.library.Library] = None


def subscribe(listener: Listener) -> Callable[[], None]:
    """Call ``listener`` with every event from now on; returns the function that stops it. For tools that read what
    only the virtual Gaudi reports: refused while it poses as hardware (``VIRTUAL_HPU_AS_HARDWARE=1``)."""
    refuse_as_hardware("virtual_hpu.events")
    return listen(listener)


def listen(listener: Listener) -> Callable[[], None]:
    """``subscribe`` for the virtual Gaudi's own use, whatever it poses as: its HPU graph capture refuses host syncs,
    as the bridge's does."""
    _register_op()
    _listeners.append(listener)
    torch.ops.virtual_hpu.report_events(True)

    def unsubscribe() -> None:
        if listener in _listeners:
            _listeners.remove(listener)
        torch.ops.virtual_hpu.report_events(bool(_listeners))

    return unsubscribe


def publish(event: Event) -> None:
    for listener in list(_listeners):
        listener(event)


def _from_native(kind: str) -> None:
    publish(Event(kind))


def _register_op() -> None:
    global _library
    if _library is None:
        _library = torch.library.Library("virtual_hpu", "IMPL")
        _library.impl("event", _from_native, "CompositeExplicitAutograd")
