"""HPU graphs: capture device work once, replay it on the same memory (``virtual_hpu.graph_capture`` does the work).

The bridge's API with its signatures: ``HPUGraph`` (``capture_begin``/``capture_end``/``replay``), the ``graph``
context manager, ``make_graphed_callables`` for training, ``wrap_in_hpu_graph`` / ``wrap_in_hpu_graph_func`` for
inference and ``ModuleCacher``, which keeps one training graph per input signature. A replay recomputes what the
capture recorded (forward, backward and optimizer step included) in the captured tensors; results equal eager.

As on Gaudi software 1.21 and later, graphs belong to lazy mode: in eager mode ``HPUGraph`` and ``graph`` raise the
bridge's ``RuntimeError``, so ``make_graphed_callables`` and the first call of a ``wrap_in_hpu_graph`` module do
too, and ``ModuleCacher`` runs the module's own forward.

Accepted and without effect on the virtual device: ``asynchronous`` (replays finish before they return), ``dry_run``
(a capture always runs the work once) and ``disable_tensor_cache`` (a graph always keeps its tensors; with it,
``wrap_in_hpu_graph`` captures on copies of the inputs rather than on the caller's tensors).
"""

import copy
import inspect
import os
from collections.abc import Sequence
from functools import wraps
from typing import Any, Callable, Optional

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from virtual_hpu import graph_capture


def _refuse_eager_mode(message: str) -> None:
    """The bridge's refusal of HPU graphs outside lazy mode (its ``hpu/graphs.py`` since 1.21), in its words."""
    import virtual_hpu

    if not virtual_hpu.config().lazy:
        raise RuntimeError(message)


class HPUGraph:
    """A captured sequence of device work that ``replay()`` runs again on the captured tensors."""

    def __init__(self) -> None:
        _refuse_eager_mode("HPUGraph class is available in lazy mode only.")
        self._recording: Optional[graph_capture.Recording] = None
        self._user_inputs: list[torch.Tensor] = []
        self._user_outputs: list[torch.Tensor] = []

    def capture_begin(self, dry_run: bool = False) -> None:
        """Start recording the device work of this thread; the work still runs."""
        recording = graph_capture.Recording()
        recording.begin()
        self._recording = recording

    def capture_end(self) -> None:
        """Stop recording; ``replay`` may be called from now on."""
        if self._recording is None:
            raise RuntimeError("capture_end() without capture_begin() on this HPUGraph")
        self._recording.end()

    def _abort_capture(self) -> None:
        if self._recording is not None and graph_capture.is_capturing(self._recording):
            self._recording.end(completed=False)

    def replay(self, asynchronous: bool = False) -> None:
        """Run the captured work again, on the captured tensors; nothing before the first capture, as on Gaudi."""
        if self._recording is not None:
            self._recording.replay()

    def replayV2(self, static_tlist: list[torch.Tensor], tlist: list[torch.Tensor], asynchronous: bool = False) -> None:
        """Replay with ``tlist`` copied into the captured inputs ``static_tlist`` first."""
        for static, new in zip(static_tlist, tlist):
            _copy_input(static, new)
        self.replay(asynchronous)

    def replayV3(self, tlistI: list[torch.Tensor], asynchronous: bool = False) -> None:
        """Replay with ``tlistI`` in place of the inputs marked with ``mark_user_inputs`` (copied into them here)."""
        for static, new in zip(self._user_inputs, tlistI):
            _copy_input(static, new)
        self.replay(asynchronous)

    def mark_user_inputs(self, static_tlist: Sequence[torch.Tensor]) -> None:
        self._user_inputs = list(static_tlist)

    def mark_user_outputs(self, static_tlist: Sequence[torch.Tensor]) -> None:
        self._user_outputs = list(static_tlist)

    def get_user_input_match_indices(self) -> list[int]:
        """Indices of the marked inputs ``replayV3`` takes directly (all of them here)."""
        return list(range(len(self._user_inputs)))

    def reset(self) -> None:
        """Drop the captured work and the tensors the graph kept."""
        self._abort_capture()
        self._recording = None
        self._user_inputs, self._user_outputs = [], []


class graph:
    """Context manager that captures the device work of its block into ``hpu_graph`` (the block runs once)."""

    def __init__(self, hpu_graph: HPUGraph, stream: Optional[Any] = None, dry_run: bool = False) -> None:
        _refuse_eager_mode("Context-manager for HPUGraph is available in lazy mode only.")
        self.hpu_graph = hpu_graph
        self.stream = stream
        self.dry_run = dry_run

    def __enter__(self) -> None:
        self.hpu_graph.capture_begin(self.dry_run)

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        if exc_type is not None:
            self.hpu_graph._abort_capture()  # the graph stays empty and the error propagates
            return
        self.hpu_graph.capture_end()


def is_current_stream_capturing() -> bool:
    """Whether an HPU graph capture is under way."""
    return graph_capture.is_capturing()


def _copy_input(static: torch.Tensor, new: torch.Tensor) -> None:
    """Copy a new input into a graph's captured input, refusing another shape as Gaudi's static graphs do."""
    if new is static:
        return
    if new.shape != static.shape:
        raise RuntimeError(
            f"HPU Graph replay: an input of shape {list(new.shape)} for a graph captured with shape"
            f" {list(static.shape)}; HPU Graphs replay static shapes only (dynamic shapes are not supported). Capture"
            " one graph per shape (wrap_in_hpu_graph and ModuleCacher do)."
        )
    static.copy_(new)


# ---- make_graphed_callables ----------------------------------------------------------------------------------------


def make_graphed_callables(
    callables: Any,
    sample_args: Any,
    warmups: int = 0,
    allow_unused_input: bool = False,
    asynchronous: bool = False,
    disable_tensor_cache: bool = False,
    dry_run: bool = False,
) -> Any:
    """Capture forward and backward of each callable into graphs; return versions that replay them under autograd.

    Args:
        callables: a module or function, or a tuple of them in the order they run.
        sample_args: a tuple of tensors per callable (a tuple of such tuples for several callables); the graphs are
            captured with them and keep them as their static inputs.
        warmups: eager forward and backward passes to run before capturing.
        allow_unused_input: allow inputs that do not contribute to the outputs (their gradient is zero).

    Returns:
        For a module, the module, whose ``forward`` replays the graphs while its training mode is the one it was
        captured in; for a function, a function that replays them. Outputs are the graph's static tensors: a later
        call overwrites them.
    """
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    for function, args in zip(callables, sample_args):
        _check_graphable(function, args)
    surfaces = [
        tuple(args) + (tuple(function.parameters()) if isinstance(function, torch.nn.Module) else ())
        for function, args in zip(callables, sample_args)
    ]
    for _ in range(warmups):
        for function, args, surface in zip(callables, sample_args, surfaces):
            outputs = _as_tuple(function(*args))
            wanted = [o for o in outputs if o.requires_grad]
            if wanted:
                torch.autograd.grad(
                    wanted,
                    [i for i in surface if i.requires_grad],
                    [torch.zeros_like(o) for o in wanted],
                    allow_unused=allow_unused_input,
                )
    forward_graphs = [HPUGraph() for _ in callables]
    static_outputs = []
    output_was_tensor = []
    for function, args, forward_graph in zip(callables, sample_args, forward_graphs):
        with graph(forward_graph):
            outputs = function(*args)
        output_was_tensor.append(isinstance(outputs, torch.Tensor))
        static_outputs.append(_as_tuple(outputs))
    graphed = [None] * len(callables)
    for index in reversed(range(len(callables))):  # backward graphs in the order backward runs them
        graphed[index] = _graphed_function(
            forward_graphs[index],
            static_outputs[index],
            surfaces[index],
            len(sample_args[index]),
            output_was_tensor[index],
            allow_unused_input,
        )
    results = []
    for function, graphed_function in zip(callables, graphed):
        if isinstance(function, torch.nn.Module):
            function.forward = _forward_in_mode(function, function.training, graphed_function, function.forward)
            results.append(function)
        else:
            results.append(graphed_function)
    return results[0] if single else tuple(results)


def _check_graphable(function: Any, args: Any) -> None:
    if isinstance(function, torch.nn.Module):
        if function._backward_hooks or function._forward_hooks or function._forward_pre_hooks:
            raise ValueError(
                "make_graphed_callables: modules must not have hooks registered when they are passed (hooks may be"
                " registered afterwards)"
            )
        if any(buffer.requires_grad for buffer in function.buffers()):
            raise ValueError(
                "make_graphed_callables: only parameters may be trainable; all buffers must have requires_grad=False"
            )
    if not isinstance(args, tuple) or not all(isinstance(arg, torch.Tensor) for arg in args):
        raise TypeError(
            "make_graphed_callables: sample_args for each callable must be a tuple of tensors; other types and keyword"
            " arguments are not allowed (ModuleCacher takes them)"
        )


def _as_tuple(outputs: Any) -> tuple:
    return (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)


def _graphed_function(
    forward_graph: HPUGraph,
    static_outputs: tuple,
    surface: tuple,
    user_args: int,
    output_was_tensor: bool,
    allow_unused_input: bool,
) -> Callable[..., Any]:
    """Capture the backward of a captured forward and tie both into an autograd function."""
    differentiable = [o for o in static_outputs if o.requires_grad]
    static_grad_outputs = tuple(torch.zeros_like(o) if o.requires_grad else None for o in static_outputs)
    wants_grad = [i for i in surface if i.requires_grad]
    backward_graph = HPUGraph()
    grads: tuple = ()
    if differentiable and wants_grad:
        with graph(backward_graph):
            grads = torch.autograd.grad(
                differentiable,
                wants_grad,
                [g for g in static_grad_outputs if g is not None],
                allow_unused=allow_unused_input,
                materialize_grads=allow_unused_input,
            )
    grads_iter = iter(grads)
    static_grad_inputs = tuple(next(grads_iter, None) if i.requires_grad else None for i in surface)
    module_params = surface[user_args:]

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *inputs: torch.Tensor) -> tuple:
            for static, new in zip(surface[:user_args], inputs[:user_args]):
                _copy_input(static, new)
            forward_graph.replay()
            return tuple(o.detach() for o in static_outputs)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple:
            for static, new in zip(static_grad_outputs, grad_outputs):
                if static is not None:
                    _copy_input(static, new)
            backward_graph.replay()
            return tuple(g.detach() if g is not None else None for g in static_grad_inputs)

    def replay(*args: torch.Tensor) -> Any:
        outputs = Graphed.apply(*(tuple(args) + module_params))
        return outputs[0] if output_was_tensor else outputs

    return replay


def _forward_in_mode(module: torch.nn.Module, training: bool, graphed: Callable, eager: Callable) -> Callable:
    def forward(*args: Any) -> Any:
        return graphed(*args) if module.training == training else eager(*args)

    return forward


# ---- wrap_in_hpu_graph ---------------------------------------------------------------------------------------------


def _signature(value: Any) -> Any:
    """What decides which graph a call replays: tensors by shape, dtype and device, other values by value."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device)
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_signature(item) for item in value))
    if isinstance(value, dict):
        return (dict, tuple((key, _signature(item)) for key, item in value.items()))
    try:
        hash(value)
    except TypeError:
        return ("object", type(value), id(value))
    return value


class _CapturedCall:
    """One graph of a wrapped function: its static input tensors (in the order of the flattened arguments) and its
    outputs."""

    def __init__(self, hpu_graph: HPUGraph, inputs: list, outputs: Any) -> None:
        self.graph, self.inputs, self.outputs = hpu_graph, inputs, outputs
        self.hits = 0


def _disable_tensor_cache_from_env(default: bool) -> bool:
    flag = os.environ.get("PT_HPUGRAPH_DISABLE_TENSOR_CACHE")
    return default if flag is None else flag == "1"


def wrap_in_hpu_graph_func(
    func: Callable[..., Any],
    asynchronous: bool = False,
    disable_tensor_cache: bool = False,
    dry_run: bool = False,
    max_graphs: Optional[int] = None,
    free_inplace: bool = False,
    verbose: bool = False,
    log_frequency: int = 100,
) -> Callable[..., Any]:
    """Return ``func`` replaying one HPU graph per input signature (tensor shapes and dtypes, other values).

    The first call with a signature captures (and runs) ``func``; later calls copy their tensors into the captured
    inputs and replay. Outputs are the graph's static tensors: the next call with the same signature overwrites them.
    Past ``max_graphs`` graphs, new signatures run eagerly. ``bypass_hpu_graphs=True`` runs ``func`` eagerly.
    """
    cache: dict[Any, _CapturedCall] = {}
    calls = 0

    @wraps(func)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        if kwargs.pop("bypass_hpu_graphs", False):
            return func(*args, **kwargs)
        calls += 1
        if verbose and calls % max(1, log_frequency) == 0:
            print(f"HPU graphs of {getattr(func, '__qualname__', func)}: {len(cache)} cached, {calls} calls")
        leaves, spec = tree_flatten((args, kwargs))
        key = _signature((args, kwargs))
        captured = cache.get(key)
        if captured is not None:
            for static, new in zip(captured.inputs, (leaf for leaf in leaves if isinstance(leaf, torch.Tensor))):
                _copy_input(static, new)
            captured.graph.replay(asynchronous)
            captured.hits += 1
            return captured.outputs
        if max_graphs is not None and len(cache) >= max_graphs:
            return func(*args, **kwargs)
        if _disable_tensor_cache_from_env(disable_tensor_cache):
            # the graph does not keep the caller's tensors: it captures on its own copies
            leaves = [leaf.detach().clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
            args, kwargs = tree_unflatten(leaves, spec)
        hpu_graph = HPUGraph()
        with graph(hpu_graph):
            outputs = func(*args, **kwargs)
        cache[key] = _CapturedCall(hpu_graph, [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)], outputs)
        return outputs

    wrapped.clear_cache = cache.clear  # type: ignore[attr-defined]
    return wrapped


def wrap_in_hpu_graph(
    module: torch.nn.Module,
    asynchronous: bool = False,
    disable_tensor_cache: bool = False,
    dry_run: bool = False,
    max_graphs: Optional[int] = None,
    free_inplace: bool = False,
    verbose: bool = False,
    log_frequency: int = 100,
) -> torch.nn.Module:
    """Make ``module.forward`` replay one HPU graph per input signature (see ``wrap_in_hpu_graph_func``), for
    inference; ``module.clear_cache()`` drops the graphs. Returns the module, changed in place."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            f"wrap_in_hpu_graph takes a torch.nn.Module, got {type(module).__name__}; wrap a function with"
            " wrap_in_hpu_graph_func"
        )
    forward = wrap_in_hpu_graph_func(
        module.forward, asynchronous, disable_tensor_cache, dry_run, max_graphs, free_inplace, verbose, log_frequency
    )
    module.forward = forward
    module.clear_cache = forward.clear_cache  # type: ignore[attr-defined]
    return module


# ---- ModuleCacher --------------------------------------------------------------------------------------------------


class _TensorArguments(torch.nn.Module):
    """A module's forward as a function of the tensors among its arguments, for ``make_graphed_callables``; the other
    arguments and the non-tensor outputs are those of the call it was captured with."""

    def __init__(self, model: torch.nn.Module, forward: Callable, leaves: list, spec: Any) -> None:
        super().__init__()
        self.model = model  # registered, so that the model's parameters are the graph's
        self._forward, self._leaves, self._spec = forward, leaves, spec
        self._positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        self.output_leaves: list = []
        self.output_spec: Any = None

    def forward(self, *tensors: torch.Tensor) -> tuple:
        leaves = list(self._leaves)
        for position, tensor in zip(self._positions, tensors):
            leaves[position] = tensor
        args, kwargs = tree_unflatten(leaves, self._spec)
        self.output_leaves, self.output_spec = tree_flatten(self._forward(*args, **kwargs))
        return tuple(leaf for leaf in self.output_leaves if isinstance(leaf, torch.Tensor))

    def rebuild(self, tensors: Sequence[torch.Tensor]) -> Any:
        outputs = iter(tensors)
        leaves = [next(outputs) if isinstance(leaf, torch.Tensor) else leaf for leaf in self.output_leaves]
        return tree_unflatten(leaves, self.output_spec)


class ModuleCacher:
    """Caches one training graph (``make_graphed_callables``) per input signature of a module's forward.

    ``ModuleCacher(max_graphs=10)(model=model, inplace=True)`` returns the model with its ``forward`` replaced. In
    training mode with gradients enabled, in lazy mode, a call whose signature (tensor shapes and dtypes, the values of
    the other arguments, keyword arguments included) has a graph replays it; a new signature is captured while fewer
    than ``max_graphs`` are cached and runs eagerly after. In eval mode or without gradients, forward runs eagerly.
    With ``use_lfu=True`` graphs are captured only for the ``max_graphs`` signatures seen most often between
    ``model.capture_start()`` and ``model.capture_end()``. With ``have_grad_accumulation=True`` the forward right after
    ``model.set_iteration_count(0)`` gets graphs of its own.
    """

    def __init__(self, max_graphs: int = 10) -> None:
        self.max_graphs = max_graphs
        self.graphs: dict[Any, tuple[_TensorArguments, Callable]] = {}
        self.hits: dict[Any, int] = {}
        self.uncached_calls = 0
        self.tracing = False
        self.iteration = -1
        self._counting: Optional[dict[Any, int]] = None
        self._priority: set[Any] = set()

    def __call__(
        self,
        model: torch.nn.Module,
        use_lfu: bool = False,
        inplace: bool = True,
        allow_unused_input: bool = False,
        asynchronous: bool = False,
        have_grad_accumulation: bool = False,
        log_frequency: int = 100,
        verbose: bool = False,
        disable_tensor_cache: bool = False,
        dry_run: bool = False,
    ) -> torch.nn.Module:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"ModuleCacher(...)(model) takes a torch.nn.Module instance, got {model!r}; as on Gaudi, wrap the"
                " instance: ModuleCacher(max_graphs=10)(model=MyModel(), inplace=True)"
            )
        if not inplace:
            model = copy.copy(model)
        self.model, self.use_lfu, self.allow_unused_input = model, use_lfu, allow_unused_input
        self.have_grad_accumulation, self.verbose, self.log_frequency = have_grad_accumulation, verbose, log_frequency
        self._eager = model.forward
        self._forward_signature = inspect.signature(self._eager)
        model.orig_forward = self._eager
        model.forward = self.forward
        model.is_hpugraph_tracing = lambda: self.tracing
        model.set_iteration_count = self.set_iteration_count
        model.capture_start = self.capture_start
        model.capture_end = self.capture_end
        return model

    def set_iteration_count(self, iteration: int) -> None:
        """With ``have_grad_accumulation``: the micro-step of the coming forward (0 right after ``zero_grad``)."""
        self.iteration = iteration

    def capture_start(self) -> None:
        """With ``use_lfu``: start counting how often each input signature comes."""
        self._counting = {}

    def capture_end(self) -> None:
        """With ``use_lfu``: graph the ``max_graphs`` most frequent signatures from now on."""
        counts = self._counting or {}
        self._priority = set(sorted(counts, key=counts.__getitem__, reverse=True)[: self.max_graphs])
        self._counting = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        bound = self._forward_signature.bind(*args, **kwargs)
        bound.apply_defaults()
        call = (bound.args, bound.kwargs)
        key = (_signature(call), self.have_grad_accumulation and self.iteration == 0)
        if self._counting is not None:
            self._counting[key] = self._counting.get(key, 0) + 1
        from habana_frameworks.torch.core import is_lazy

        use_graphs = self.model.training and torch.is_grad_enabled() and is_lazy()
        if use_graphs and key not in self.graphs and self._counting is None:
            if key in self._priority if self.use_lfu else len(self.graphs) < self.max_graphs:
                self._capture(key, call)
        if not use_graphs or key not in self.graphs:
            self.uncached_calls += 1
            return self._eager(*args, **kwargs)
        self.hits[key] = self.hits.get(key, 0) + 1
        if self.verbose and sum(self.hits.values()) % max(1, self.log_frequency) == 0:
            print(f"ModuleCacher: {len(self.graphs)} graphs, {sum(self.hits.values())} cached calls")
        function, graphed = self.graphs[key]
        tensors = [leaf for leaf in tree_flatten(call)[0] if isinstance(leaf, torch.Tensor)]
        return function.rebuild(_as_tuple(graphed(*tensors)))

    def _capture(self, key: Any, call: tuple) -> None:
        leaves, spec = tree_flatten(call)
        function = _TensorArguments(self.model, self._eager, leaves, spec)
        # the wrapper stands for the model: captured in the model's mode, it replays while the model is in it
        function.train(self.model.training)
        tensors = tuple(leaf for leaf in leaves if isinstance(leaf, torch.Tensor))
        self.tracing = True
        try:
            graphed = make_graphed_callables(function, tensors, allow_unused_input=self.allow_unused_input)
        finally:
            self.tracing = False
        self.graphs[key] = (function, graphed)
