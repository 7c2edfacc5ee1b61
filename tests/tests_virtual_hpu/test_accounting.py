"""Lazy-mode accounting: graph cuts, ops per graph and device-to-host syncs."""

import habana_frameworks.torch.core as htcore
import pytest
import torch

from virtual_hpu import accounting


@pytest.mark.parametrize("hpu_mode", ["lazy"])
def test_mark_step_cuts_graphs_in_lazy_mode(hpu_mode):
    x = torch.ones(4, device="hpu")
    accounting.reset()
    y = (x + 1) * 2
    pending = accounting.counters()["ops_since_cut"]
    assert pending >= 2
    htcore.mark_step()
    htcore.mark_step()  # nothing pending: counted as a call, not as a graph
    counts = accounting.counters()
    assert htcore.is_lazy()
    assert counts["mark_steps"] == 2 and counts["graphs"] == 1
    assert counts["last_graph_ops"] == pending and counts["ops_since_cut"] == 0
    assert counts["host_syncs"] == 0
    del y


def test_host_reads_are_counted_as_syncs():
    x = torch.arange(6.0, device="hpu")
    reads = [lambda: x.sum().item(), x.cpu, x.tolist, lambda: x.to("cpu"), lambda: repr(x), lambda: float(x[0])]
    for read in reads:
        accounting.reset()
        read()
        assert accounting.counters()["host_syncs"] >= 1, read
    accounting.reset()
    (x * 2).add_(1)
    torch.zeros(3).to("hpu")  # host-to-device is no sync
    assert accounting.counters()["host_syncs"] == 0


@pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])
def test_a_sync_ends_the_pending_graph_in_lazy_mode(hpu_mode):
    x = torch.ones(3, device="hpu")
    accounting.reset()
    (x + x).sum().item()
    counts = accounting.counters()
    assert counts["host_syncs"] == 1 and counts["mark_steps"] == 0
    if hpu_mode == "lazy":
        assert counts["graphs"] == 1 and counts["ops_since_cut"] == 0
    else:
        assert counts["graphs"] == 0 and counts["ops_since_cut"] == counts["ops"] > 0


@pytest.mark.parametrize("hpu_mode", ["eager"])
def test_eager_mode_mark_step_is_a_no_op(hpu_mode):
    accounting.reset()
    x = torch.ones(2, device="hpu") * 3
    htcore.mark_step()
    x.sum().item()
    counts = accounting.counters()
    assert not htcore.is_lazy()
    assert (counts["mark_steps"], counts["graphs"], counts["host_syncs"]) == (0, 0, 1) and counts["ops"] > 0
