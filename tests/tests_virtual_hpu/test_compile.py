"""``torch.compile(backend="hpu_backend")`` and the bridge's compilation metrics on the virtual Gaudi."""

import pytest
import torch
from habana_frameworks.torch.hpu.metrics import metric_global, metric_localcontext
from torch import nn

from virtual_hpu import accounting, compilation

pytestmark = pytest.mark.usefixtures("fresh_compilation_state")


def _pair(make):
    torch.manual_seed(0)
    cpu = make().eval()
    hpu = make().eval().to("hpu")
    hpu.load_state_dict(cpu.state_dict())
    return cpu, hpu


def _block() -> nn.Module:
    return nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)


def _compilations() -> int:
    return dict(metric_global("graph_compilation").stats())["TotalNumber"]


def test_backend_is_registered_like_the_bridges():
    assert "hpu_backend" in torch._dynamo.list_backends()


def _run(module: nn.Module, x: torch.Tensor, device: str, bf16: bool) -> torch.Tensor:
    with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        out = module(x.to(device))
    out.float().square().sum().backward()
    return out


def test_compiled_transformer_block_matches_cpu_in_fp32():
    cpu, hpu = _pair(_block)
    x = torch.randn(2, 5, 16)
    expected = _run(cpu, x, "cpu", bf16=False)
    actual = _run(torch.compile(hpu, backend="hpu_backend"), x, "hpu", bf16=False)
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-5, atol=1e-5)
    for (name, p_cpu), p_hpu in zip(cpu.named_parameters(), hpu.parameters()):
        torch.testing.assert_close(p_hpu.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert _compilations() == 2  # forward and backward


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_compiled_matches_eager_on_the_device(bf16):
    """Compiling changes how the graph is launched, not what it computes (Gaudi's autocast lists included)."""
    _, eager = _pair(_block)
    _, compiled = _pair(_block)
    x = torch.randn(2, 5, 16)
    expected = _run(eager, x, "hpu", bf16)
    actual = _run(torch.compile(compiled, backend="hpu_backend"), x, "hpu", bf16)
    assert actual.dtype == expected.dtype == (torch.bfloat16 if bf16 else torch.float32)
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=1e-2 if bf16 else 1e-5, atol=1e-2 if bf16 else 1e-5)
    for (name, p_eager), p_compiled in zip(eager.named_parameters(), compiled.parameters()):
        assert p_compiled.grad.dtype == torch.float32
        torch.testing.assert_close(p_compiled.grad.cpu(), p_eager.grad.cpu(), rtol=2e-2, atol=2e-2, msg=name)


def test_graph_compilation_counts_recompilations_only():
    _, hpu = _pair(_block)
    compiled = torch.compile(hpu, backend="hpu_backend")

    def step(batch: int) -> None:
        compiled(torch.randn(batch, 5, 16, device="hpu")).sum().backward()

    step(4)
    first = metric_global("graph_compilation").stats()
    assert [key for key, _ in first] == ["TotalNumber", "TotalTime", "AvgTime"]
    assert dict(first)["TotalNumber"] == 2
    with metric_localcontext("graph_compilation") as local:
        step(4)
        step(4)
        assert dict(local.stats())["TotalNumber"] == 0  # same shapes: the compiled graphs are reused
        step(3)  # a ragged batch: dynamo recompiles forward and backward
        assert dict(local.stats())["TotalNumber"] == 2
    assert _compilations() == 4
    metric_global("graph_compilation").reset()
    assert _compilations() == 0


def test_cpu_fallback_metric_has_the_bridges_shape():
    assert metric_global("cpu_fallback").stats() == [("TotalNumber", 0), ("FallbackOps", {})]


def test_unknown_metric_names_the_known_ones():
    with pytest.raises(ValueError, match="'graph_compilation', 'cpu_fallback'"):
        metric_global("graph_compilations")


def test_compiling_in_lazy_mode_fails_with_the_fix(python):
    result = python(
        """
        import torch
        import pytorch_lightning  # activates in lazy mode, where `import torch` alone does not
        compiled = torch.compile(torch.nn.Linear(2, 2).to("hpu"), backend="hpu_backend")
        compiled(torch.ones(1, 2, device="hpu"))
        """,
        VIRTUAL_HPU="1",
        PT_HPU_LAZY_MODE="1",
    )
    assert result.returncode != 0
    assert "Unset PT_HPU_LAZY_MODE" in result.stderr


def test_recompilation_records_ops_shapes_and_dynamos_reason():
    _, hpu = _pair(_block)
    compiled = torch.compile(hpu, backend="hpu_backend")
    compiled(torch.randn(4, 5, 16, device="hpu")).sum().backward()
    compiled(torch.randn(3, 5, 16, device="hpu")).sum().backward()
    first_forward, first_backward, forward, backward = compilation.graphs()
    assert first_forward.reason is None and first_backward.reason is None
    assert forward.reason is not None and forward.reason == backward.reason
    assert "size" in forward.reason  # dynamo names the guard on the batch dimension that failed
    assert first_forward.ops > 10 and first_backward.ops > 10
    assert (4, 5, 16) in first_forward.input_shapes


def test_accounting_counts_compilations_and_graph_breaks_since_its_reset():
    def broken(x: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    compiled = torch.compile(broken, backend="hpu_backend")
    accounting.reset()
    compiled(torch.ones(3, device="hpu"))
    counts = accounting.counters()
    assert counts["graph_breaks"] == 1
    assert counts["graph_compilations"] == 2  # one graph on each side of the break
    accounting.reset()
    compiled(torch.ones(3, device="hpu"))
    assert accounting.counters()["graph_compilations"] == 0
    assert dict(metric_global("graph_compilation").stats())["TotalNumber"] == 2  # the bridge's metric keeps counting


@pytest.mark.parametrize("hpu_mode", ["lazy"])
def test_lazy_graphs_count_as_compilations_once_per_shape(hpu_mode):
    import habana_frameworks.torch.core as htcore

    layer = nn.Linear(8, 4).to("hpu")
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)

    def step(batch: int) -> int:
        layer(torch.randn(batch, 8).to("hpu")).sum().backward()
        htcore.mark_step()
        optimizer.step()
        optimizer.zero_grad()
        htcore.mark_step()
        return _compilations()

    step(4)
    warm = step(4)
    assert warm >= 2  # the forward+backward graph and the optimizer's
    assert step(4) == warm  # a shape seen before comes from the cache
    assert step(3) == warm + 1  # a ragged batch: the forward+backward graph is new, the optimizer's is not
    assert step(4) == step(3) == warm + 1
    assert accounting.counters()["graph_compilations"] >= warm + 1


@pytest.mark.parametrize("backend", ["aot_eager", "hpu_backend"])
def test_compiled_attention_on_permuted_projections_runs(backend):
    """Query, key and value as views of one projection, as GPT blocks write them: on torch 2.6 and 2.7 attention
    decomposes into elementwise ops and views on hpu, planned on fake tensors' strides, which the device's results
    must have."""
    torch._dynamo.reset()

    def attend(qkv: torch.Tensor) -> torch.Tensor:
        q, k, v = qkv.view(2, 16, 3, 4, 8).permute(2, 0, 3, 1, 4)
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    qkv = torch.randn(2, 16, 96)
    compiled = torch.compile(attend, backend=backend)(qkv.to("hpu"))
    torch.testing.assert_close(compiled.cpu(), attend(qkv), rtol=1e-5, atol=1e-5)
