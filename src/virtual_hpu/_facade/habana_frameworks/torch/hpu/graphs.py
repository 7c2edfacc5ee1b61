"""HPU graphs. The virtual device does not capture: ``graph`` runs its block eagerly and ``replay`` does nothing.

Code written for HPU graphs therefore runs, but a replay does not recompute the captured work.
"""

from typing import Any, Optional


class HPUGraph:
    """A graph that records nothing (see the module docstring)."""

    def capture_begin(self, *args: Any, **kwargs: Any) -> None:
        """Start of a capture: nothing to prepare."""

    def capture_end(self) -> None:
        """End of a capture: nothing was recorded."""

    def replay(self) -> None:
        """Nothing was captured, so nothing runs."""


class graph:
    """Context manager that "captures" into ``hpu_graph`` by running the block once, eagerly."""

    def __init__(self, hpu_graph: HPUGraph, stream: Optional[Any] = None, **kwargs: Any) -> None:
        self.hpu_graph = hpu_graph

    def __enter__(self) -> None:
        self.hpu_graph.capture_begin()

    def __exit__(self, *exc: object) -> None:
        self.hpu_graph.capture_end()
