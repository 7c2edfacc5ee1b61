"""torch.profiler sees hpu work and hpu memory."""

import json

import torch
from torch.profiler import ProfilerActivity, profile

import virtual_hpu

# c10::DeviceType of hpu: HPU, or PrivateUse1 on a torch built for another accelerator (from 2.9)
DEVICE_TYPE = 20 if virtual_hpu.is_privateuse1() else 15


def test_trace_contains_hpu_ops_and_memory(tmp_path):
    assert ProfilerActivity.HPU in torch.profiler.supported_activities()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.HPU], profile_memory=True) as prof:
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
