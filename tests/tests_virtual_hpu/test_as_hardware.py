"""``VIRTUAL_HPU_AS_HARDWARE=1``: the virtual Gaudi works as before but hides what Intel's bridge does not expose."""

CHECK = """
import torch
import virtual_hpu
from habana_frameworks.torch.hpu.metrics import metric_global
from virtual_hpu import accounting, events

x = torch.ones(4, device="hpu") * 2
print("device", x.device.type, float(x.sum()), torch.hpu.device_count())
print("active", virtual_hpu.is_active())
print("bridge metric", "TotalNumber" in dict(metric_global("graph_compilation").stats()))
for hidden in (accounting.counters, lambda: events.subscribe(print)):
    try:
        hidden()
        print("hidden", False)
    except RuntimeError as error:
        print("hidden", "VIRTUAL_HPU_AS_HARDWARE" in str(error))
"""


def test_posing_as_hardware_hides_only_what_the_bridge_lacks(python):
    shown = python(CHECK, VIRTUAL_HPU="1", VIRTUAL_HPU_AS_HARDWARE="1")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split("\n")[:5] == [
        "device hpu 8.0 8",
        "active False",
        "bridge metric True",
        "hidden True",
        "hidden True",
    ]


def test_the_virtual_gaudi_shows_itself_otherwise(python):
    shown = python(CHECK, VIRTUAL_HPU="1")
    assert shown.returncode == 0, shown.stderr
    assert "active True" in shown.stdout and "hidden False" in shown.stdout


def test_a_bad_switch_is_refused(python):
    shown = python("import torch, virtual_hpu; virtual_hpu.is_active()", VIRTUAL_HPU="1", VIRTUAL_HPU_AS_HARDWARE="yes")
    assert "VIRTUAL_HPU_AS_HARDWARE must be 1" in shown.stderr
