"""Streams and events. The virtual device runs every op to completion on the host, so they never wait."""

from typing import Any, Optional

import torch

import virtual_hpu

# the bridge's name for whether lazy mode is on (fixed when the device is activated)
is_lazy_mode = virtual_hpu.config().lazy


class Stream(torch.Stream):
    """An HPU stream; ``torch.Stream`` already does all a synchronous device needs."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> "Stream":
        if "stream_id" in kwargs:  # an existing stream, given by id, index and type
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=_hpu(device), priority=priority)


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:
    """An HPU event: a ``torch.Event`` on ``hpu`` (not a subclass, which torch's ``elapsed_time`` rejects).

    It records a host timestamp, so ``elapsed_time`` measures host time.
    """
    return torch.Event(device="hpu", enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)


def _hpu(device: Any) -> torch.device:
    from habana_frameworks.torch.hpu import _index

    return torch.device("hpu", _index(device))


def current_stream(device: Any = None) -> Stream:
    return default_stream(device)


def default_stream(device: Any = None) -> Stream:
    new = Stream(device)  # only to learn the index and type code of the device
    return Stream(stream_id=0, device_index=new.device_index, device_type=new.device_type)


def set_stream(stream: Optional[torch.Stream]) -> None:
    """Select ``stream`` for the ops that follow; all streams are the same one on a synchronous device."""


class StreamContext:
    """Context manager selecting a stream; a no-op on a device without concurrency."""

    def __init__(self, stream: Optional[torch.Stream]) -> None:
        self.stream = stream

    def __enter__(self) -> Optional[torch.Stream]:
        return self.stream

    def __exit__(self, *exc: object) -> None:
        return None


def stream(stream: Optional[torch.Stream]) -> StreamContext:
    return StreamContext(stream)


def record_stream(self: torch.Tensor, stream: torch.Stream) -> None:
    """Mark the tensor ``self`` as used by ``stream``: nothing to track when every op completes before it returns."""


def get_stream_info(stream: torch.Stream) -> str:
    raise NotImplementedError(
        "hpu.get_stream_info reports the state of a Gaudi's hardware stream, which the virtual Gaudi does not model"
        " (its streams are synchronous); call it on a Gaudi."
    )
