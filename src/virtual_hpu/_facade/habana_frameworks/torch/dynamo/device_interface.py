"""``habana_frameworks.torch.dynamo.device_interface``: what dynamo (and inductor) need to know of the ``hpu`` runtime.

Dynamo asks the interface registered for a device for its stream and event classes and its ``current_stream``, so it
can model streams in a graph: FSDP's pre-forward reads ``torch.hpu.current_stream()`` inside the compiled region. The
bridge registers its interface for ``"hpu"`` when ``habana_frameworks.torch.dynamo`` is imported; so does the virtual
Gaudi, with the facade's functions.
"""

from typing import Any

from torch._dynamo.device_interface import DeviceInterface

from habana_frameworks.torch import hpu


class HpuInterface(DeviceInterface):
    """The ``hpu`` runtime as dynamo sees it: the functions of ``torch.hpu`` and its ``torch.Stream`` subclass."""

    device = hpu.device
    Stream = hpu.Stream
    # a factory of plain ``torch.Event``s on ``hpu`` (see ``hpu.streams.Event``)
    Event = hpu.Event  # type: ignore[assignment]

    class Worker:
        """Device queries that work in processes that did not set the device up: the virtual Gaudi's always do."""

        @staticmethod
        def set_device(device: int) -> None:
            hpu.set_device(device)

        @staticmethod
        def current_device() -> int:
            return hpu.current_device()

        @staticmethod
        def get_device_properties(device: Any = None) -> str:
            # torch 2.6's inductor asks every available device for them when its compile workers start
            return hpu.get_device_properties(device)

    current_device = staticmethod(hpu.current_device)
    set_device = staticmethod(hpu.set_device)
    device_count = staticmethod(hpu.device_count)
    is_available = staticmethod(hpu.is_available)
    stream = staticmethod(hpu.stream)  # type: ignore[assignment]
    current_stream = staticmethod(hpu.current_stream)
    # what a ``torch.hpu.stream(...)`` block in a compiled region calls on entering and leaving (torch 2.6 traces them)
    set_stream = staticmethod(hpu.set_stream)
    synchronize = staticmethod(hpu.synchronize)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        """Select a stream made outside the compiled region, by its ids: all are the device's one stream here."""

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        """Every op of the virtual Gaudi runs on its device's one stream, whose id is 0."""
        return 0

    @staticmethod
    def get_compute_capability(device: Any = None) -> str:
        return hpu.get_device_name(device)

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return hpu.is_bf16_supported()
