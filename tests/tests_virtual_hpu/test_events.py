"""``virtual_hpu.events``: listeners hear each host sync and compilation while subscribed, and nothing after."""

import torch

from virtual_hpu import events


def test_host_syncs_reach_listeners_only_while_subscribed():
    heard = []
    stop = events.subscribe(heard.append)
    x = torch.ones(3, device="hpu")
    x.sum().item()
    x.cpu()
    stop()
    x.sum().item()
    assert [event.kind for event in heard] == [events.HOST_SYNC, events.HOST_SYNC]


def test_compiled_graphs_carry_their_reason_and_source():
    heard = []
    stop = events.subscribe(heard.append)

    def double(a):
        return (a * 2).relu()

    compiled = torch.compile(double, backend="hpu_backend")
    try:
        compiled(torch.ones(4, device="hpu"))
        compiled(torch.ones(5, device="hpu"))
    finally:
        stop()
        torch._dynamo.reset()
    graphs = [event.graph for event in heard if event.kind == events.COMPILATION]
    assert len(graphs) == 2 and graphs[0].reason is None
    assert "size mismatch at index 0. expected 4, actual 5" in graphs[1].reason
    assert graphs[1].source.endswith(f"{__file__}:{double.__code__.co_firstlineno + 1} in double")


def test_lazy_graph_compilations_are_heard(python):
    result = python(
        """
        import virtual_hpu; virtual_hpu.activate()
        import torch
        import habana_frameworks.torch.core as htcore
        from virtual_hpu import events
        heard = []
        events.subscribe(heard.append)
        for size in (4, 4, 5, 4):
            (torch.ones(size, device="hpu") * 2).sum()
            htcore.mark_step()
        print([event.kind for event in heard])
        """,
        PT_HPU_LAZY_MODE="1",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("['compilation', 'compilation']")
