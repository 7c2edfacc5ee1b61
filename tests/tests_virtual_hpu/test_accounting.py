"""Lazy-mode accounting: graph cuts, ops per graph and device-to-host syncs."""

import habana_frameworks.torch.core as htcore
import torch

from virtual_hpu import accounting


def test_mark_step_cuts_graphs_in_lazy_mode():
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


def test_a_sync_ends_the_pending_graph():
    x = torch.ones(3, device="hpu")
    accounting.reset()
    (x + x).sum().item()
    counts = accounting.counters()
    assert counts["graphs"] == 1 and counts["ops_since_cut"] == 0 and counts["mark_steps"] == 0


def test_eager_mode_mark_step_is_a_no_op(python):
    result = python(
        """
        import torch, virtual_hpu
        virtual_hpu.activate()
        import habana_frameworks.torch.core as htcore
        from virtual_hpu import accounting
        x = torch.ones(2, device="hpu") * 3
        htcore.mark_step()
        x.sum().item()
        c = accounting.counters()
        print(htcore.is_lazy(), c["mark_steps"], c["graphs"], c["host_syncs"], c["ops"] > 0)
        """,
        PT_HPU_LAZY_MODE="0",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "0", "0", "1", "True"]
