"""Dynamo knows the ``hpu`` runtime as it does with the bridge: its device interface and its trace rules.

FSDP's pre-forward reads ``torch.hpu.current_stream()`` inside a compiled region; without the interface dynamo traced
into the facade's ``Stream`` and stopped ("StreamVariable() is not a constant").
"""

import pytest
import torch
from habana_frameworks.torch.dynamo.device_interface import HpuInterface
from torch._dynamo.device_interface import get_interface_for_device
from torch._dynamo.utils import counters

pytestmark = pytest.mark.usefixtures("fresh_compilation_state")


def test_hpu_has_a_device_interface_with_torch_stream_classes():
    interface = get_interface_for_device("hpu")
    assert interface is HpuInterface
    assert issubclass(interface.Stream, torch.Stream)
    stream = interface.current_stream()
    assert isinstance(stream, torch.Stream) and stream.device == torch.device("hpu", torch.hpu.current_device())
    assert interface.device_count() == torch.hpu.device_count() and interface.is_available()
    assert isinstance(interface.Event(), torch.Event)


def _with_runtime_queries(x: torch.Tensor) -> torch.Tensor:
    # what FSDP's pre-forward and device-agnostic model code ask the runtime
    stream = torch.hpu.current_stream()
    with torch.hpu.stream(stream):
        y = x * 2 + 1
    if torch.hpu.is_available() and torch.hpu.device_count() > 0:
        y = y + torch.hpu.current_device()
    return y


def test_runtime_queries_stay_in_one_graph():
    counters.clear()  # torch's counts are for the process: an earlier test's graph breaks are in them
    x = torch.randn(4, device="hpu")
    compiled = torch.compile(_with_runtime_queries, backend="hpu_backend", fullgraph=True)
    torch.testing.assert_close(compiled(x).cpu(), _with_runtime_queries(x).cpu())
    assert sum(counters["graph_break"].values()) == 0


def test_the_runtime_package_is_not_traced_into():
    from torch._dynamo.trace_rules import check_file

    assert check_file(torch.hpu.memory.__file__).skipped
