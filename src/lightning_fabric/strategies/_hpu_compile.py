"""``torch.compile(model)`` on HPUs, as CUDA code writes it: the compile backend a module runs with on a Gaudi.

Inductor, torch's default compile backend, generates code for CPUs and GPUs only; a Gaudi has none (the bridge does
not add any), so a module compiled with it fails at its first step ("LoweringException"). Gaudi's compiler is the
bridge's ``hpu_backend``. When an HPU strategy of Fabric or the Trainer sets up a module compiled with inductor, it
compiles it with ``hpu_backend`` instead and says so once in the log:

- dynamo's arguments (``fullgraph``, ``dynamic``, ``disable``, ...) are kept; inductor's own ``mode`` and ``options``
  (autotuning, CUDA graphs, Triton settings) mean nothing to ``hpu_backend`` and are left out;
- ``backend="inductor"`` named explicitly is treated as the default: it names torch's own compiler, which on a Gaudi is
  ``hpu_backend``, and keeping it could only fail later, in the first step;
- any other backend the user named (``"hpu_backend"``, ``"eager"``, ``"aot_eager"``, a function) is kept.

``torch.compile`` is for eager mode only on Gaudi. In lazy mode (``PT_HPU_LAZY_MODE=1``), where the device builds and
compiles its own graphs, a module compiled with inductor runs uncompiled, logged likewise; one compiled with
``hpu_backend`` by name is refused before any step, since the user asked for what lazy mode cannot run.
"""

from typing import Any, Callable, Optional

import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.utilities.rank_zero import rank_zero_info

HPU_BACKEND = "hpu_backend"
# arguments of ``torch.compile`` that only inductor reads
_INDUCTOR_ONLY = ("mode", "options")


def is_lazy() -> bool:
    import habana_frameworks.torch.core as htcore

    return htcore.is_lazy()


def hpu_compile_arguments(compile_kwargs: dict[str, Any], lazy: bool, say: bool = True) -> Optional[dict[str, Any]]:
    """The ``torch.compile`` arguments to run a module with on HPUs, given those it was compiled with (as Lightning
    records them); ``None`` to run it uncompiled (lazy mode), or ``compile_kwargs`` itself for a backend that is kept.
    ``say=False`` leaves the change out of the log (it was said for another module of the same model).

    Raises:
        MisconfigurationException: ``backend="hpu_backend"`` in lazy mode.
    """
    backend = compile_kwargs.get("backend")
    if backend not in (None, "inductor"):
        if lazy and backend == HPU_BACKEND:
            raise MisconfigurationException(_LAZY_REFUSAL)
        return compile_kwargs
    dropped = {name: compile_kwargs[name] for name in _INDUCTOR_ONLY if compile_kwargs.get(name) is not None}
    unused = f" ({', '.join(f'{name}={value!r}' for name, value in dropped.items())} not used: inductor's own)"
    if lazy:
        if say:
            rank_zero_info(
                f"The module compiled with {_described(backend)} runs uncompiled: `torch.compile` is for eager mode"
                " only on HPU, and lazy mode (PT_HPU_LAZY_MODE=1) compiles the device's graphs itself."
            )
        return None
    if say:
        rank_zero_info(
            f"The module compiled with {_described(backend)} runs with `backend='{HPU_BACKEND}'`, Gaudi's compiler:"
            f" inductor has no HPU code generation{unused if dropped else ''}."
        )
    kept = {name: value for name, value in compile_kwargs.items() if name not in _INDUCTOR_ONLY}
    return {**kept, "backend": HPU_BACKEND}


def _described(backend: Optional[str]) -> str:
    return "torch's default backend (inductor)" if backend is None else "`backend='inductor'`"


_LAZY_REFUSAL = (
    f"`torch.compile(..., backend='{HPU_BACKEND}')` runs in eager mode only, and lazy mode is on (PT_HPU_LAZY_MODE=1)."
    " Unset PT_HPU_LAZY_MODE (eager mode is the default) to compile, or pass the module uncompiled: lazy mode compiles"
    " the device's graphs itself."
)


# where torch's compile wrappers keep what they wrap: the name torch 2.9 gives it, and the one before (2.6, 2.7.1)
_WRAPPED = ("_torchdynamo_orig_backend", "_torchdynamo_orig_callable")


def recorded_arguments(dynamo_ctx: Any) -> dict[str, Any]:
    """The ``torch.compile`` arguments that matter here, read from the compile context of a module the Trainer runs
    (it keeps the context, not the arguments): the backend (``None`` for inductor, which the context does not say
    whether it was named), ``fullgraph`` and ``dynamic``."""
    chain = _wrapped_chain(dynamo_ctx.callback)
    backend = chain[-1]
    inductor = isinstance(backend, torch._TorchCompileInductorWrapper)
    name = None if inductor else getattr(backend, "compiler_name", backend)
    if hasattr(dynamo_ctx, "fullgraph"):
        fullgraph = dynamo_ctx.fullgraph
    else:
        # before torch 2.9 the context does not say: a whole-graph compile wraps the converter that refuses breaks
        from torch._dynamo.convert_frame import ConvertFrameAssert

        fullgraph = any(isinstance(wrapper, ConvertFrameAssert) for wrapper in chain)
    return {"backend": name, "fullgraph": fullgraph, "dynamic": dynamo_ctx._dynamic}


def _wrapped_chain(callback: Any) -> list[Any]:
    """A compile context's callback and what it wraps, down to the backend."""
    chain = [callback]
    while (attribute := next((name for name in _WRAPPED if hasattr(chain[-1], name)), None)) is not None:
        chain.append(getattr(chain[-1], attribute))
    return chain


def compile_submodules_for_hpu(module: torch.nn.Module) -> None:
    """Have the compiled submodules of ``module`` (``self.encoder = torch.compile(encoder)``, or blocks compiled in
    ``configure_model`` or a ``parallelize_fn``, as upstream documents for FSDP2) run with the backend chosen above,
    each replaced in its parent; the change is logged once for all of them."""
    from torch._dynamo import OptimizedModule

    said = False
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, OptimizedModule):
                continue
            recorded = recorded_arguments(child.dynamo_ctx)
            arguments = hpu_compile_arguments(recorded, is_lazy(), say=not said)
            if arguments is recorded:
                continue
            said = True
            setattr(parent, name, child._orig_mod if arguments is None else torch.compile(child._orig_mod, **arguments))


class FabricRecompilation:
    """For Fabric's HPU strategies: the module Fabric compiles again after the strategy set it up, compiled for HPU.

    Fabric removes the ``torch.compile`` wrapper before the strategy sees the module, and applies it again, with the
    arguments it recorded, when it wraps the result in its ``_FabricModule``; nothing in between sees those
    arguments. So the strategy arms this when it sets a module up, and the first ``_FabricModule`` that is then built
    gets its compiled module replaced as it is registered (torch's module registration hook); the hook is removed at
    once, and if the set-up fails.
    """

    _handle: Optional[Any] = None

    @classmethod
    def armed_around(cls, setup: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``setup(*args, **kwargs)`` (the strategy's module set-up), armed for the ``_FabricModule`` that follows."""
        if cls._handle is None:
            cls._handle = torch.nn.modules.module.register_module_module_registration_hook(cls._replace)
        try:
            return setup(*args, **kwargs)
        except BaseException:
            cls.disarm()
            raise

    @classmethod
    def disarm(cls) -> None:
        if cls._handle is not None:
            cls._handle.remove()
            cls._handle = None

    @classmethod
    def _replace(cls, parent: torch.nn.Module, name: str, submodule: torch.nn.Module) -> Optional[torch.nn.Module]:
        from lightning.fabric.wrappers import _FabricModule
        from torch._dynamo import OptimizedModule

        if not (isinstance(parent, _FabricModule) and name == "_forward_module"):
            return None
        cls.disarm()
        recorded = getattr(submodule, "_compile_kwargs", None)
        if not isinstance(submodule, OptimizedModule) or recorded is None:
            return None
        arguments = hpu_compile_arguments(recorded, is_lazy())
        if arguments is recorded:
            return None
        return submodule._orig_mod if arguments is None else torch.compile(submodule._orig_mod, **arguments)
