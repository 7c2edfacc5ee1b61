"""``enable_compiled_autograd``: compile the backward passes with ``hpu_backend`` too (torch's compiled autograd)."""

import functools
import logging
from typing import Any

import torch

_log = logging.getLogger(__name__)


def enable_compiled_autograd(**kwargs: Any) -> None:
    """From now on, backward passes are captured by dynamo and compiled with ``hpu_backend`` (``kwargs`` go to each
    ``torch.compile``). Call it before the first ``torch.compile``; it resets dynamo's caches.

    As the bridge does, DDP's gradient reduction becomes part of the compiled backward (``optimize_ddp =
    "python_reducer"``) and the autograd fallback of ops without a backward formula is turned off.
    """
    from torch._dynamo import compiled_autograd

    _log.warning("Enabling compiled autograd with hpu_backend for torch.compile")

    def compile_backward(graph: torch.fx.GraphModule) -> Any:
        return torch.compile(graph, backend="hpu_backend", **kwargs)

    torch._dynamo.reset()  # which, from torch 2.5, also unsets the autograd compiler: set it after
    torch._C._dynamo.compiled_autograd.set_autograd_compiler(
        functools.partial(compiled_autograd.AutogradCompilerInstance, compile_backward), False
    )
    compiled_autograd.compiled_autograd_enabled = True
    # torch's own switch (compiled_autograd._enable) runs the backward on the calling thread, as capture requires
    torch._C._set_multithreading_enabled(False)
    torch._dynamo.config.optimize_ddp = "python_reducer"
    torch._C._set_autograd_fallback_mode("nothing")
