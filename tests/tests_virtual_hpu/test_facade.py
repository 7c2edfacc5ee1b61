"""The habana_frameworks API that integrations (Lightning, DeepSpeed) call."""

import json
import os

import habana_frameworks.torch.core as htcore
import habana_frameworks.torch.hpu as hthpu
import pytest
import torch
from habana_frameworks.torch.core.step_closure import _mark_step_if_lazy
from habana_frameworks.torch.utils import experimental, internal, library_loader


@pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])
def test_device_queries(hpu_mode):
    assert torch.hpu is hthpu
    assert hthpu.is_available() and library_loader.is_habana_available()
    assert hthpu.device_count() == 8 == torch.hpu.device_count()
    assert hthpu.get_device_name() == "GAUDI2"
    assert experimental._get_device_type() == experimental.synDeviceType.synDeviceGaudi2
    assert experimental._is_fp16_supported()
    assert internal.is_lazy() == htcore.is_lazy() == (hpu_mode == "lazy")
    hthpu.set_device(3)
    try:
        assert hthpu.current_device() == 3
        assert torch.empty(1, device="hpu").device == torch.device("hpu:3")
    finally:
        hthpu.set_device(0)
    with pytest.raises(RuntimeError, match="hpu:9"):
        hthpu.set_device(9)
    hthpu.synchronize()


def test_autocast_state_helpers_of_the_bridge():
    assert hthpu.is_bf16_supported()
    assert not torch.hpu.is_autocast_hpu_enabled()
    with torch.autocast("hpu", dtype=torch.float16):
        assert torch.hpu.is_autocast_hpu_enabled() and torch.hpu.get_autocast_hpu_dtype() == torch.float16
    assert not torch.hpu.is_autocast_hpu_enabled()
    previous = torch.hpu.get_autocast_hpu_dtype()
    try:
        torch.hpu.set_autocast_hpu_enabled(True)
        torch.hpu.set_autocast_hpu_dtype(torch.bfloat16)
        assert torch.is_autocast_enabled("hpu") and torch.get_autocast_dtype("hpu") == torch.bfloat16
        # what the setters switched on is what ops see
        assert (torch.ones(2, 2, device="hpu") @ torch.ones(2, 2, device="hpu")).dtype == torch.bfloat16
    finally:
        torch.hpu.set_autocast_hpu_enabled(False)
        torch.hpu.set_autocast_hpu_dtype(previous)
    assert not torch.is_autocast_enabled("hpu")


def test_random_state_is_shared_with_cpu():
    hthpu.random.manual_seed(123)
    assert hthpu.random.initial_seed() == 123
    state = hthpu.random.get_rng_state()
    first = torch.randn(4, device="hpu")
    hthpu.random.set_rng_state(state)
    assert torch.equal(torch.randn(4, device="hpu"), first)
    torch.manual_seed(123)
    assert torch.equal(torch.randn(4), first.cpu())
    assert hthpu.random.default_generators[7] is torch.default_generator
    with pytest.raises(IndexError):
        hthpu.random.default_generators[8]


def test_streams_and_events():
    stream = hthpu.Stream()
    assert isinstance(stream, torch.Stream) and stream.device == torch.device("hpu:0")
    assert hthpu.default_stream().stream_id == 0 and hthpu.current_stream().device_type == stream.device_type
    with hthpu.stream(stream):
        torch.ones(2, device="hpu")
    start, end = htcore.hpu.Event(enable_timing=True), hthpu.Event(enable_timing=True)
    start.record()
    torch.ones(1000, device="hpu").sum()
    end.record()
    end.synchronize()
    assert start.query() and start.elapsed_time(end) >= 0


@pytest.mark.parametrize("hpu_mode", ["lazy"])
def test_graphs(hpu_mode):
    graph = hthpu.HPUGraph()
    with hthpu.graph(graph):
        captured = torch.ones(2, device="hpu") + 1
    graph.replay()
    assert captured.tolist() == [2.0, 2.0]


def test_core_helpers(monkeypatch):
    # as in Intel's bridge, hpu_set_env is the inference-mode switch, and reads or writes no environment
    monkeypatch.setattr(htcore, "_inference_mode", False)
    monkeypatch.setattr(htcore, "_set_env_called", False)
    environment = dict(os.environ)
    model = torch.nn.Linear(2, 2).to("hpu")
    assert htcore.hpu_set_env(model) is model and htcore._inference_mode
    htcore.hpu_reset_env()
    assert not htcore._inference_mode and dict(os.environ) == environment
    assert htcore.hpu_initialize(model, mark_only_scales_as_const=True) is None
    _mark_step_if_lazy()


def test_core_exposes_step_closure(python):
    # DeepSpeed's FusedAdam reaches it as an attribute of ``core``, as the real ``core/__init__`` imports it
    result = python(
        """
        import virtual_hpu
        virtual_hpu.activate()
        import habana_frameworks.torch.core as htcore
        htcore.step_closure._mark_step_if_lazy()
        """
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("lazy", ["1", "0"], ids=["lazy", "eager"])
def test_step_closures_run_after_the_next_cut_in_lazy_mode_only(python, lazy):
    # Gaudi scripts read a loss's value in a closure, after the graph computing it ran (``add_step_closure``)
    result = python(
        """
        import json, logging, torch, virtual_hpu
        virtual_hpu.activate()
        import habana_frameworks.torch.core as htcore
        from virtual_hpu import accounting
        logging.basicConfig()
        seen = []
        loss = torch.tensor(2.5, device="hpu")
        htcore.add_step_closure(lambda value, tag: seen.append([value.item(), tag]), (loss, "a"))
        before = list(seen)
        htcore.mark_step()
        after_cut = list(seen)
        htcore.add_step_closure(seen.append, ("b",))
        htcore.iter_mark_step()
        htcore.mark_step()
        print(json.dumps([before, after_cut, seen, accounting.counters()["mark_steps"]]))
        """,
        PT_HPU_LAZY_MODE=lazy,
    )
    assert result.returncode == 0, result.stderr
    before, after_cut, seen, mark_steps = json.loads(result.stdout.strip().splitlines()[-1])
    if lazy == "1":
        assert before == [] and after_cut == [[2.5, "a"]]
        assert seen == [[2.5, "a"], "b"]  # each closure once, after the cut that followed it
        assert mark_steps == 3
    else:
        # the bridge's three calls are lazy-mode only: nothing runs, and each says so once, when it loads
        assert before == after_cut == seen == [] and mark_steps == 0
        said = [line for line in result.stderr.splitlines() if "lazy mode only functionality" in line]
        assert said == [
            f"Calling {name} function does not have any effect. It's"
            " lazy mode only functionality. (warning logged once)"
            for name in ("add_step_closure", "mark_step", "iter_mark_step")
        ], result.stderr


def test_checkpointing_uses_the_device_module():
    layer = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).to("hpu")
    x = torch.randn(2, 4, device="hpu", requires_grad=True)
    out = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
    out.sum().backward()
    assert x.grad.device.type == "hpu"


@pytest.mark.parametrize("wd_as_tensor", [False, True], ids=["lazy", "eager"])
def test_fused_adamw_op(wd_as_tensor):
    """torch.ops.hpu.optimizer_adamw as DeepSpeed's FusedAdam calls it, against the formula it implements."""
    torch.manual_seed(0)
    lr, beta1, beta2, eps, wd, step = 1e-2, 0.9, 0.999, 1e-8, 0.1, 3
    weights = [torch.randn(5, 3), torch.randn(7)]
    grads = [torch.randn_like(w) for w in weights]
    m = [torch.randn_like(w) for w in weights]
    v = [torch.rand_like(w) for w in weights]
    neg_step = -lr * (1 - beta2**step) ** 0.5 / (1 - beta1**step)
    hpu = [[t.to("hpu") for t in ts] for ts in (grads, weights, m, v)]
    modified_wd = 1 - wd * lr
    wd_arg = torch.tensor([modified_wd], device="hpu") if wd_as_tensor else modified_wd
    torch.ops.hpu.optimizer_adamw(*hpu, torch.tensor([neg_step], device="hpu"), beta1, beta2, eps, wd_arg)
    for g, w, m_, v_, (hw, hm, hv) in zip(grads, weights, m, v, zip(hpu[1], hpu[2], hpu[3])):
        m_ = beta1 * m_ + (1 - beta1) * g
        v_ = beta2 * v_ + (1 - beta2) * g * g
        w = w * modified_wd + neg_step * m_ / (v_.sqrt() + eps)
        torch.testing.assert_close(hm.cpu(), m_)
        torch.testing.assert_close(hv.cpu(), v_)
        torch.testing.assert_close(hw.cpu(), w)
        assert hw.device.type == "hpu"
