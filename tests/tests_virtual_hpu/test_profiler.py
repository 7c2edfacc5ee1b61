"""torch.profiler sees hpu work and hpu memory."""

import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import virtual_hpu
from virtual_hpu import torch_support

# c10::DeviceType of hpu: HPU, or PrivateUse1 on a torch built for another accelerator (from 2.9)
DEVICE_TYPE = 20 if virtual_hpu.is_privateuse1() else 15


def _device_activities() -> list:
    """What code may add to ``ProfilerActivity.CPU``: nothing, Gaudi's ``HPU``, and where hpu is PrivateUse1 that."""
    hpu = pytest.param("HPU", id="HPU")
    if torch_support.installed() < torch_support.PROFILER_HAS_HPU_ACTIVITY:
        hpu = pytest.param("HPU", id="HPU", marks=pytest.mark.skip(reason="ProfilerActivity.HPU needs torch 2.7"))
    privateuse1 = [pytest.param("PrivateUse1", id="PrivateUse1")] if virtual_hpu.is_privateuse1() else []
    return [pytest.param(None, id="CPU"), hpu, *privateuse1]


@pytest.mark.parametrize("device_activity", _device_activities())
def test_trace_contains_hpu_ops_and_memory(tmp_path, device_activity):
    activities = [ProfilerActivity.CPU]
    if device_activity is not None:
        activities.append(getattr(ProfilerActivity, device_activity))
        # as on a Gaudi, whatever the build's name for hpu
        assert ProfilerActivity.HPU in torch.profiler.supported_activities()
    with profile(activities=activities, profile_memory=True) as prof:
        a = torch.randn(64, 64, device="hpu:1")
        b = torch.mm(a, a).relu()
        del a, b
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert {"aten::mm", "aten::relu"} <= names
    memory = [e["args"] for e in events if e.get("name") == "[memory]"]
    hpu = [m for m in memory if m["Device Type"] == DEVICE_TYPE and m["Device Id"] == 1]
    assert any(m["Bytes"] == 64 * 64 * 4 for m in hpu)
    assert any(m["Bytes"] == -64 * 64 * 4 for m in hpu)
