"""Capture and replay of HPU graphs on the virtual Gaudi (``habana_frameworks.torch.hpu.HPUGraph`` is built on it).

Between ``begin`` and ``end`` a dispatch mode records every aten op that touches an hpu tensor: the op, its arguments
(the tensor objects themselves) and its results. The ops run as they are recorded, so a capture also does the work
once, as a capture in lazy mode does on Gaudi. Autograd's backward ops and an optimizer's ops are aten ops too: run
inside a capture, they are recorded with the rest.

A replay runs the recorded ops again, in order, on the same tensors, with autograd and autocast out of the way (the
level at which they were recorded):

* an op that writes into an argument (in-place, ``out=``) writes into the captured argument again;
* an op that returns a new tensor computes it again and copies it into the tensor it returned at capture, so whoever
  holds that tensor (the user, autograd's saved tensors, a later recorded op) sees the new values in the same memory;
* views, metadata queries and ``empty`` allocations are not run again: a captured view already looks at the memory
  the replay writes, and the contents of an ``empty`` tensor are undefined anyway.

The graph keeps its tensors alive, so the memory in use stays the same from replay to replay. Random ops draw fresh
numbers at each replay, from the generator ``hpu`` shares with the CPU and in the same order as the eager step would,
so a captured step with dropout replays exactly like eager steps.

What Gaudi cannot capture is refused while capturing, with Gaudi's words ("... is not supported during HPU Graph
capturing"): reading a device value on the host (``.item()``, ``.tolist()``, ``.cpu()``, printing a tensor,
``torch.equal``) and ops whose output shape depends on the data (``nonzero``, ``masked_select``, ``unique``, boolean
indexing). A replay refuses inputs whose shape, dtype or memory changed since the capture.

Nothing here is on the path of an op when no capture is under way.
"""

from collections.abc import Iterator
from typing import Any, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
_NOT_SUPPORTED = "is not supported during HPU Graph capturing"

# ops whose output shape depends on the values of their inputs
_DATA_DEPENDENT_SHAPE = {
    _aten.nonzero,
    _aten.masked_select,
    _aten._unique,
    _aten._unique2,
    _aten.unique_dim,
    _aten.unique_consecutive,
    _aten.unique_dim_consecutive,
}
# ops that read device values on the host
_HOST_READS = {
    _aten._local_scalar_dense.default,
    _aten.item.default,
    _aten.equal.default,
    _aten.allclose.default,
    _aten.is_nonzero.default,
}
# allocations whose contents are undefined: a replay leaves the captured tensor as it is
_UNDEFINED_CONTENTS = {
    _aten.empty.memory_format,
    _aten.empty_strided.default,
    _aten.empty_like.default,
    _aten.empty_permuted.default,
    _aten.new_empty.default,
    _aten.new_empty_strided.default,
}
# The keys a dispatch mode runs below (autograd, autocast, functorch, ...), except the mode key itself: a replay
# dispatches its ops from where they were recorded, and an enclosing capture still sees them.
_ABOVE_RECORDING = (
    torch._C._dispatch_keyset_full() - torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.Python)
).remove(torch._C.DispatchKey.Python)

_capturing: Optional["Recording"] = None


def is_capturing(recording: Optional["Recording"] = None) -> bool:
    """Whether a capture is under way in this process (into ``recording``, when given)."""
    return _capturing is not None and (recording is None or _capturing is recording)


def _is_hpu(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "hpu"


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in an op's argument or result, in order: a tensor, or (nested) lists and tuples of them."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _shape(tensor: torch.Tensor) -> list[int]:
    return list(tensor.shape)


class _Op:
    """One recorded op and the captured tensors its fresh results are copied into at replay: ``(index among the op's
    tensor results, captured tensor)``."""

    __slots__ = ("func", "args", "kwargs", "fill")

    def __init__(self, func: Any, args: tuple, kwargs: dict, fill: tuple) -> None:
        self.func, self.args, self.kwargs, self.fill = func, args, kwargs, fill


class _Input:
    """A device tensor the graph reads that it did not produce, as it was at the end of the capture."""

    __slots__ = ("tensor", "shape", "dtype", "data_ptr")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor, self.shape, self.dtype, self.data_ptr = tensor, tensor.shape, tensor.dtype, tensor.data_ptr()

    def check(self, index: int) -> None:
        tensor = self.tensor
        if tensor.shape != self.shape or tensor.dtype != self.dtype:
            raise RuntimeError(
                f"HPU Graph replay: captured input {index} is now {tensor.dtype} of shape {_shape(tensor)}, but the"
                f" graph was captured with {self.dtype} of shape {list(self.shape)}. HPU Graphs replay static shapes"
                " only (dynamic shapes are not supported): copy new data of the captured shape into the captured"
                " tensors, or capture one graph per shape (wrap_in_hpu_graph and ModuleCacher do)."
            )
        if tensor.data_ptr() != self.data_ptr:
            raise RuntimeError(
                f"HPU Graph replay: captured input {index} (shape {_shape(tensor)}) no longer uses the memory it was"
                " captured with (its storage was replaced, e.g. by `.data = ...` or `set_`). A replay reads and writes"
                " the captured memory: copy new values into the captured tensor with `copy_` instead."
            )


class Recording(TorchDispatchMode):
    """The ops of one capture (see the module docstring); ``replay()`` runs them again."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[_Op] = []
        self.inputs: list[_Input] = []
        self.complete = False
        self._produced: set[int] = set()  # ids of tensors that recorded ops returned (kept alive by ``ops``)
        self._read: dict[int, torch.Tensor] = {}  # device tensors read before anything recorded produced them
        self._alive: list[torch.Tensor] = []

    # ---- capture -------------------------------------------------------------------------------------------------

    def begin(self) -> None:
        global _capturing
        if _capturing is not None:
            raise RuntimeError("An HPU Graph capture is already under way: only one capture at a time is supported")
        from virtual_hpu import events

        self.__enter__()
        _capturing = self
        # host reads that bypass dispatch modes (printing a tensor disables them) still reach the device's counters
        self._stop_listening = events.listen(_refuse_host_sync)

    def end(self, completed: bool = True) -> None:
        """Stop recording; with ``completed=False`` (the capture failed) the graph cannot be replayed."""
        global _capturing
        if _capturing is not self:
            raise RuntimeError("capture_end() without capture_begin(): no HPU Graph capture is under way")
        _capturing = None
        self._stop_listening()
        self.__exit__(None, None, None)
        self.inputs = [_Input(tensor) for tensor in self._read.values()]
        self._read, self._produced, self._alive = {}, set(), []
        self.complete = completed
        if not completed:
            self.ops, self.inputs = [], []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        arguments = [t for t in _tensors(list(args) + list(kwargs.values()))]
        if any(_is_hpu(t) for t in arguments):
            _refuse_uncapturable(func, args, kwargs)
        result = func(*args, **kwargs)
        results = list(_tensors(result))
        if any(_is_hpu(t) for t in arguments) or any(_is_hpu(t) for t in results):
            self._record(func, args, kwargs, arguments, results)
        return result

    def _record(self, func: Any, args: tuple, kwargs: dict, arguments: list, results: list) -> None:
        for tensor in arguments:
            if _is_hpu(tensor) and id(tensor) not in self._produced:
                self._read.setdefault(id(tensor), tensor)
        # results stay alive until the capture ends, so that no other tensor takes the id of one in ``_produced``
        self._alive.extend(results)
        self._produced.update(id(tensor) for tensor in results)
        if func in _UNDEFINED_CONTENTS:
            return
        storages = {t.untyped_storage().data_ptr() for t in arguments}
        storages.discard(0)
        fill = tuple(
            (index, tensor)
            for index, tensor in enumerate(results)
            if tensor.numel() > 0
            and tensor.untyped_storage().data_ptr() not in storages
            and not any(tensor is t for t in arguments)
        )
        # an op with no fresh result that writes nothing is a view or a metadata query: its results already look at
        # the memory a replay writes
        if fill or _mutates(func):
            self.ops.append(_Op(func, args, kwargs, fill))

    # ---- replay --------------------------------------------------------------------------------------------------

    def replay(self) -> None:
        if not self.complete:
            raise RuntimeError("HPU Graph replay: this graph holds no completed capture (call capture_end() first)")
        for index, captured in enumerate(self.inputs):
            captured.check(index)
        with torch._C._ExcludeDispatchKeyGuard(_ABOVE_RECORDING):
            for op in self.ops:
                result = op.func(*op.args, **op.kwargs)
                if op.fill:
                    _copy_results(op, result)


def _copy_results(op: _Op, result: Any) -> None:
    results = list(_tensors(result))
    for index, captured in op.fill:
        new = results[index]
        if new.shape != captured.shape:
            raise RuntimeError(
                f"HPU Graph replay: {op.func} returned shape {_shape(new)} where the capture returned"
                f" {_shape(captured)}; HPU Graphs replay static shapes only (dynamic shapes are not supported)"
            )
        captured.copy_(new)


_mutating: dict[Any, bool] = {}


def _mutates(func: Any) -> bool:
    """Whether ``func`` writes into one of its arguments (in-place and ``out=`` ops)."""
    known = _mutating.get(func)
    if known is None:
        schema = getattr(func, "_schema", None)
        known = schema is None or any(
            argument.alias_info is not None and argument.alias_info.is_write for argument in schema.arguments
        )
        _mutating[func] = known
    return known


def _refuse_uncapturable(func: Any, args: tuple, kwargs: dict) -> None:
    """Raise for an op on device tensors that Gaudi cannot put into an HPU graph."""
    name = getattr(func, "_name", str(func))
    if func in _HOST_READS:
        raise RuntimeError(
            f"{name} (reading a device value on the host: .item(), .tolist(), printing a tensor, torch.equal or"
            f" Python control flow on a tensor) {_NOT_SUPPORTED}. HPU Graphs capture device work only: read values"
            " after capture_end() or after a replay."
        )
    if _copies_to_host(func, args, kwargs):
        raise RuntimeError(
            f"{name} from hpu to the host (.cpu(), .to('cpu'), .numpy(), printing a tensor) {_NOT_SUPPORTED}. HPU"
            " Graphs capture device work only: copy results to the host after capture_end() or after a replay."
        )
    packet = getattr(func, "overloadpacket", None)
    dynamic = packet in _DATA_DEPENDENT_SHAPE
    if func is _aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
        dynamic = True
    if func is _aten.index.Tensor:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        dynamic = any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)
    if dynamic:
        raise RuntimeError(
            f"{name} (its output shape depends on the values of its input) {_NOT_SUPPORTED}: HPU Graphs capture static"
            " shapes only; dynamic shapes and data-dependent control flow are not supported."
        )


def _refuse_host_sync(event: Any) -> None:
    from virtual_hpu import events

    if event.kind == events.HOST_SYNC:
        raise RuntimeError(
            f"Reading a device value on the host (.item(), .tolist(), .cpu(), printing a tensor) {_NOT_SUPPORTED}."
            " HPU Graphs capture device work only: read values after capture_end() or after a replay."
        )


def _copies_to_host(func: Any, args: tuple, kwargs: dict) -> bool:
    if func is _aten._to_copy.default:
        device = kwargs.get("device")
        return _is_hpu(args[0]) and device is not None and torch.device(device).type != "hpu"
    if func is _aten.copy_.default:
        return not _is_hpu(args[0]) and _is_hpu(args[1])
    if func in (_aten._copy_from.default, _aten._copy_from_and_resize.default):
        return _is_hpu(args[0]) and not _is_hpu(args[1])
    return False
