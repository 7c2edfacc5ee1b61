"""HPU graphs on the virtual Gaudi: a replay recomputes the captured work on the captured memory, as on Gaudi.

HPU graphs are a lazy-mode feature on Gaudi, so most tests run in lazy mode (a child session, see tests/conftest.py).
"""

import copy

import habana_frameworks.torch as ht
import habana_frameworks.torch.core as htcore
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from virtual_hpu import graph_capture

NOT_SUPPORTED = "is not supported during HPU Graph capturing"


def _classifier(seed: int = 0, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 5)).to("hpu")


def _batches(count: int, size: int = 16, seed: int = 1) -> list:
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, 20, generator=generator), torch.randint(0, 5, (size,), generator=generator))
        for _ in range(count)
    ]


OPTIMIZERS = {
    "sgd-momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adamw-capturable": lambda params: torch.optim.AdamW(params, lr=0.01, capturable=True),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
}


def _train(batches: list, optimizer_name: str, autocast: bool, hpu_graph=None) -> tuple:
    """Losses and final weights of one step per batch, eagerly or (with ``hpu_graph``) as warm-up, capture, replays."""
    model = _classifier(dropout=0.3)
    optimizer = OPTIMIZERS[optimizer_name](model.parameters())
    torch.manual_seed(2)
    static_x = torch.zeros(16, 20, device="hpu")
    static_y = torch.zeros(16, dtype=torch.long, device="hpu")

    def step():
        loss = F.cross_entropy(model(static_x), static_y)
        loss.backward()
        optimizer.step()
        return loss

    losses = []
    for index, (x, y) in enumerate(batches):
        static_x.copy_(x)
        static_y.copy_(y)
        with torch.autocast("hpu", dtype=torch.bfloat16, enabled=autocast):
            if hpu_graph is None or index == 0:  # eager, or the warm-up that creates the optimizer's state
                optimizer.zero_grad(set_to_none=True)
                loss = step()
            elif index == 1:
                optimizer.zero_grad(set_to_none=True)
                with ht.hpu.graph(hpu_graph):
                    loss = step()
            else:
                hpu_graph.replay()
        htcore.mark_step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("hpu_mode", ["lazy"])
@pytest.mark.parametrize(
    ("optimizer_name", "autocast"), [("sgd-momentum", False), ("adamw-capturable", True), ("sgd-momentum", True)]
)
def test_a_replayed_training_step_trains_exactly_like_eager(hpu_mode, optimizer_name, autocast):
    """Warm-up, capture, then replays of forward, backward and the optimizer step: the same losses and weights as
    eager steps on the same batches, dropout included (a replay draws the same random numbers an eager step would)."""
    batches = _batches(8)
    eager_losses, eager_weights = _train(batches, optimizer_name, autocast)
    losses, weights = _train(batches, optimizer_name, autocast, ht.hpu.HPUGraph())
    assert losses == eager_losses
    assert len(set(losses)) == len(losses)  # each replay computed a new loss
    for graphed, eager in zip(weights, eager_weights):
        torch.testing.assert_close(graphed, eager, rtol=0, atol=0)


@pytest.mark.parametrize("hpu_mode", ["lazy"])
def test_python_numbers_of_a_captured_step_are_constants(hpu_mode):
    """Adam without ``capturable`` counts its steps on the host and computes its bias correction in Python: the graph
    keeps the correction of the captured step, as on Gaudi, so replays drift from eager steps."""
    batches = _batches(6)
    eager_losses, eager_weights = _train(batches, "adam", autocast=False)
    losses, weights = _train(batches, "adam", autocast=False, hpu_graph=ht.hpu.HPUGraph())
    assert losses[:3] == eager_losses[:3] and losses[3:] != eager_losses[3:]
    assert not torch.equal(weights[0], eager_weights[0])


@pytest.mark.parametrize("hpu_mode", ["lazy"])
def test_capture_begin_end_replays_on_the_captured_memory(hpu_mode):
    hpu_graph = ht.hpu.HPUGraph()
    static_input = torch.zeros(4, device="hpu")
    counter = torch.zeros(1, device="hpu")
    hpu_graph.capture_begin()
    constant = torch.full((4,), 1.0, device="hpu")
    doubled = static_input * 2
    result = (doubled + constant).relu()
    view = result.view(2, 2)
    counter.add_(1)
    created = torch.zeros(1, device="hpu").add_(1)
    hpu_graph.capture_end()
    assert not ht.hpu.graphs.is_current_stream_capturing()
    assert result.tolist() == [1.0] * 4 and counter.item() == 1  # the capture ran the work once

    address = result.data_ptr()
    for value in (1.0, -3.0, 2.5):
        static_input.copy_(torch.full((4,), value))
        hpu_graph.replay()
        expected = max(2 * value + 1, 0.0)
        assert result.tolist() == [expected] * 4 and view.tolist() == [[expected] * 2] * 2
    assert result.data_ptr() == address
    assert counter.item() == 4  # in-place work is redone at every replay
    assert created.item() == 1  # and a tensor the graph created is created again


@pytest.mark.parametrize("hpu_mode", ["lazy"])
def test_replays_allocate_nothing_that_stays(hpu_mode):
    model = _classifier(seed=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    static_x = torch.randn(64, 20, device="hpu")
    static_y = torch.randint(0, 5, (64,), device="hpu")
    hpu_graph = ht.hpu.HPUGraph()
    with ht.hpu.graph(hpu_graph):
        loss = F.cross_entropy(model(static_x), static_y)
        loss.backward()
        optimizer.step()
    in_use = ht.hpu.memory_allocated()
    for _ in range(5):
        static_x.normal_()
        hpu_graph.replay()
        assert ht.hpu.memory_allocated() == in_use
    # the graph owns its intermediate tensors: dropping it frees them
    del hpu_graph, loss
    assert ht.hpu.memory_allocated() < in_use


@pytest.mark.parametrize("hpu_mode", ["lazy"])
def test_wrap_in_hpu_graph_outputs_equal_eager_on_new_inputs(hpu_mode, monkeypatch):
    reference = _classifier(seed=4).eval()
    model = ht.hpu.wrap_in_hpu_graph(copy.deepcopy(reference), max_graphs=2)
    captures = []
    capture_begin = ht.hpu.HPUGraph.capture_begin

    def counting_capture_begin(graph, *args, **kwargs):
        captures.append(graph)
        capture_begin(graph, *args, **kwargs)

    monkeypatch.setattr(ht.hpu.HPUGraph, "capture_begin", counting_capture_begin)
    with torch.no_grad():
        outputs = []
        for batch in (8, 8, 8, 3, 3, 8):
            x = torch.randn(batch, 20, device="hpu")
            out = model(x)
            torch.testing.assert_close(out, reference(x), rtol=0, atol=0)
            outputs.append(out)
        assert len(captures) == 2  # one graph per input shape
        assert outputs[0] is outputs[1] is outputs[2] is outputs[5]  # replays return the graph's static outputs
        assert outputs[3] is outputs[4]
        beyond = model(torch.randn(5, 20, device="hpu"))  # a third shape, over max_graphs: runs eagerly
        assert len(captures) == 2 and beyond.shape == (5, 5)
        x = torch.randn(8, 20, device="hpu")
        bypassed = model(x, bypass_hpu_graphs=True)
        assert bypassed is not outputs[0] and torch.equal(bypassed, reference(x))
    model.clear_cache()
    with torch.no_grad():
        assert model(torch.randn(8, 20, device="hpu")) is not outputs[0]


@pytest.mark.parametrize("hpu_mode", ["lazy"])
@pytest.mark.parametrize("disable_tensor_cache", [False, True])
def test_wrap_in_hpu_graph_keeps_the_callers_tensors_only_with_the_tensor_cache(hpu_mode, disable_tensor_cache):
    model = ht.hpu.wrap_in_hpu_graph(nn.Identity(), disable_tensor_cache=disable_tensor_cache)
    first, second = torch.zeros(3, device="hpu"), torch.ones(3, device="hpu")
    with torch.no_grad():
        model(first)
        assert model(second).tolist() == [1.0] * 3
    # with the tensor cache (the default), the graph captured on the caller's tensor and copies new inputs into it
    assert first.tolist() == ([0.0] * 3 if disable_tensor_cache else [1.0] * 3)


@pytest.mark.parametrize("hpu_mode", ["lazy"])
def test_make_graphed_callables_equal_eager_forward_and_backward(hpu_mode):
    reference = _classifier(seed=5)
    module = copy.deepcopy(reference)

    def scale(x):
        return (x * 3).tanh()

    sample = torch.randn(16, 20, device="hpu", requires_grad=True)
    graphed_module, graphed_scale = ht.hpu.make_graphed_callables((module, scale), ((sample,), (sample,)))
    assert graphed_module is module
    for x, _ in _batches(3, seed=6):
        x = x.to("hpu").requires_grad_()
        x_eager = x.detach().clone().requires_grad_()
        out, out_eager = graphed_module(x), reference(x_eager)
        torch.testing.assert_close(out, out_eager, rtol=0, atol=0)
        (out.square().sum() + graphed_scale(x).sum()).backward()
        (out_eager.square().sum() + scale(x_eager).sum()).backward()
        torch.testing.assert_close(x.grad, x_eager.grad, rtol=0, atol=0)
        for graphed_param, eager_param in zip(module.parameters(), reference.parameters()):
            torch.testing.assert_close(graphed_param.grad, eager_param.grad, rtol=0, atol=0)
            graphed_param.grad = eager_param.grad = None
    with pytest.raises(RuntimeError, match="static shapes only"):
        graphed_module(torch.randn(4, 20, device="hpu"))
    module.eval()  # another mode than the captured one: runs eagerly
    x = torch.randn(4, 20, device="hpu")
    torch.testing.assert_close(module(x), reference.eval()(x))


@pytest.mark.parametrize("hpu_mode", ["lazy"])
def test_module_cacher_trains_like_eager_with_a_graph_per_signature(hpu_mode):
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x, condition=False):
            x = self.first(x)
            return {"out": (self.a(x) if condition else self.b(x)).view(x.shape[0], -1)}

    torch.manual_seed(7)
    reference = Net().to("hpu")
    model = copy.deepcopy(reference)
    cacher = ht.hpu.ModuleCacher(max_graphs=3)
    assert cacher(model=model, inplace=True, allow_unused_input=True) is model
    generator = torch.Generator().manual_seed(8)
    shapes, conditions = [(2, 3, 4), (3, 2, 4)], [True, False]
    for step in range(10):
        x = torch.randn(shapes[step % 2], generator=generator).to("hpu")
        y = torch.randn(x.shape[0], generator=generator).to("hpu")
        condition = conditions[(step // 2) % 2]
        for net in (model, reference):
            net.zero_grad(set_to_none=True)
            loss = F.mse_loss(net(x.clone(), condition=condition)["out"].mean(1), y)
            loss.backward()
            with torch.no_grad():
                for p in net.parameters():
                    if p.grad is not None:  # the branch not taken has none (zeros in a graph with unused inputs)
                        p -= 0.1 * p.grad
    assert len(cacher.graphs) == 3 and cacher.uncached_calls == 2  # 4 signatures, 3 graphs: the last runs eagerly
    for graphed, eager in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(graphed, eager, rtol=1e-6, atol=1e-6)
    model.eval()  # in eval mode the forward runs eagerly
    x = torch.randn(2, 3, 4, device="hpu")
    torch.testing.assert_close(model(x)["out"], reference(x)["out"], rtol=1e-6, atol=1e-6)
    assert cacher.uncached_calls == 3
    with pytest.raises(TypeError, match="Module instance"):
        ht.hpu.ModuleCacher()(Net)


@pytest.mark.parametrize("hpu_mode", ["lazy"])
@pytest.mark.parametrize(
    "read",
    [
        lambda t: t.sum().item(),
        lambda t: t.cpu(),
        lambda t: t.tolist(),
        lambda t: print(t),
        lambda t: bool(t.sum() > 0),
        lambda t: torch.equal(t, t),
    ],
    ids=["item", "cpu", "tolist", "print", "control-flow", "equal"],
)
def test_host_reads_are_refused_during_capture(hpu_mode, read):
    x = torch.ones(4, device="hpu")
    hpu_graph = ht.hpu.HPUGraph()
    with pytest.raises(RuntimeError, match=NOT_SUPPORTED), ht.hpu.graph(hpu_graph):
        y = x * 2
        read(y)
    assert not ht.hpu.graphs.is_current_stream_capturing()
    assert torch._C._len_torch_dispatch_stack() == 0
    with pytest.raises(RuntimeError, match="no completed capture"):
        hpu_graph.replay()
    assert (x * 2).sum().item() == 8  # reading works again once the capture is over


@pytest.mark.parametrize("hpu_mode", ["lazy"])
def test_dynamic_shapes_are_refused(hpu_mode):
    x = torch.tensor([0.0, 1.0, 2.0], device="hpu")
    for dynamic in (torch.nonzero, lambda t: t[t > 0], lambda t: torch.masked_select(t, t > 0), torch.unique):
        with pytest.raises(RuntimeError, match=f"output shape depends on .*{NOT_SUPPORTED}"):
            with ht.hpu.graph(ht.hpu.HPUGraph()):
                dynamic(x)

    static_input = torch.ones(3, device="hpu")
    captured_memory = static_input.detach()  # keeps the captured memory from being reused below
    hpu_graph = ht.hpu.HPUGraph()
    with ht.hpu.graph(hpu_graph):
        result = static_input * 2
    static_input.data = torch.ones(5, device="hpu")  # the graph was captured for 3 elements
    with pytest.raises(RuntimeError, match=r"shape \[5\].*captured with torch.float32 of shape \[3\].*static shapes"):
        hpu_graph.replay()
    static_input.data = torch.full((3,), 4.0, device="hpu")  # the captured shape, in other memory
    with pytest.raises(RuntimeError, match="no longer uses the memory"):
        hpu_graph.replay()
    static_input.data = captured_memory
    hpu_graph.replay()
    assert result.tolist() == [2.0] * 3


@pytest.mark.parametrize("hpu_mode", ["eager"])
def test_eager_mode_refuses_graphs_as_the_bridge_does(hpu_mode):
    """Gaudi software 1.21 on (bridge ``hpu/graphs.py``): graphs are lazy-mode only, in the bridge's words."""
    assert not htcore.is_lazy()
    with pytest.raises(RuntimeError, match=r"^HPUGraph class is available in lazy mode only\.$"):
        ht.hpu.HPUGraph()
    with pytest.raises(RuntimeError, match=r"^Context-manager for HPUGraph is available in lazy mode only\.$"):
        ht.hpu.graph(None)
    x = torch.ones(2, device="hpu")
    with pytest.raises(RuntimeError, match="HPUGraph class is available in lazy mode only"):
        ht.hpu.make_graphed_callables(torch.nn.Linear(2, 2).to("hpu"), (x,))
    # wrapping succeeds; the first call, which would capture, raises
    module = ht.hpu.wrap_in_hpu_graph(torch.nn.Linear(2, 2).to("hpu"))
    with pytest.raises(RuntimeError, match="HPUGraph class is available in lazy mode only"):
        module(x)
    assert module(x, bypass_hpu_graphs=True).shape == (2,)
    # ModuleCacher runs the module's own forward
    cached = ht.hpu.ModuleCacher(max_graphs=2)(model=torch.nn.Linear(2, 2).to("hpu"), inplace=True)
    cached(x).sum().backward()
    assert cached.weight.grad is not None


@pytest.mark.parametrize("hpu_mode", ["lazy"])
def test_nothing_is_on_the_op_path_outside_a_capture(hpu_mode):
    hpu_graph = ht.hpu.HPUGraph()
    with ht.hpu.graph(hpu_graph):
        assert torch._C._len_torch_dispatch_stack() == 1 and graph_capture.is_capturing()
        with pytest.raises(RuntimeError, match="only one capture at a time"):
            ht.hpu.HPUGraph().capture_begin()
    assert torch._C._len_torch_dispatch_stack() == 0 and not graph_capture.is_capturing()
