"""``habana_frameworks.torch.hpex.optimizers`` on the virtual Gaudi against torch's optimizers (or the published
algorithm, for LAMB and LARS) on the CPU: steps, param groups, ``zero_grad`` and ``state_dict`` round trips."""

import copy
import math

import pytest
import torch
from habana_frameworks.torch.hpex import optimizers as hpex_optimizers
from habana_frameworks.torch.hpex.optimizers import (
    Adam,
    AdamW,
    FusedAdagrad,
    FusedAdamW,
    FusedLamb,
    FusedLars,
    FusedResourceApplyMomentum,
    FusedSGD,
)
from habana_frameworks.torch.hpex.optimizers.distributed import FusedAdamW as DistributedFusedAdamW
from torch import nn

from virtual_hpu import accounting

DTYPES = [torch.float32, torch.bfloat16]
STEPS = 3


def _tolerance(dtype: torch.dtype) -> dict:
    return dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


def _model(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).to(dtype)


def _groups(model: nn.Module, **second_group) -> list:
    """Two parameter groups, the second with its own learning rate (and whatever else is given)."""
    return [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.05, **second_group}]


def _backward(model: nn.Module, step: int) -> None:
    generator = torch.Generator().manual_seed(step)
    first = next(model.parameters())
    device, dtype = first.device, first.dtype
    x = torch.randn(4, 6, generator=generator).to(device, dtype)
    target = torch.randn(4, 3, generator=generator).to(device, dtype)
    nn.functional.mse_loss(model(x).float(), target.float()).backward()


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        optimizer.zero_grad()
        _backward(model, step)
        optimizer.step()


def _assert_same_parameters(actual: nn.Module, expected: nn.Module, dtype: torch.dtype) -> None:
    for (name, a), e in zip(actual.named_parameters(), expected.parameters()):
        assert a.device.type == "hpu" and a.dtype == dtype
        torch.testing.assert_close(a.detach().cpu(), e.detach(), **_tolerance(dtype), msg=name)


# (our optimizer, its torch counterpart, keyword arguments for both, keyword arguments of the second group)
TORCH_COUNTERPARTS = {
    "sgd": (FusedSGD, torch.optim.SGD, dict(lr=0.1), {}),
    "sgd-momentum": (
        FusedSGD,
        torch.optim.SGD,
        dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
        {"momentum": 0.5},
    ),
    "sgd-nesterov": (FusedSGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01), {}),
    # Gaudi's kernel adds eps where torch does not (test_fused_adamw_adds_eps_as_gaudis_kernel): a negligible eps here
    "adamw": (FusedAdamW, torch.optim.AdamW, dict(lr=0.01, eps=1e-12, weight_decay=0.1), {"weight_decay": 0.0}),
    "adagrad": (
        FusedAdagrad,
        torch.optim.Adagrad,
        dict(lr=0.1, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1),
        {},
    ),
    "markstep-adam": (Adam, torch.optim.Adam, dict(lr=0.01, weight_decay=0.01, amsgrad=True), {}),
    "markstep-adamw": (AdamW, torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1), {"betas": (0.8, 0.99)}),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", TORCH_COUNTERPARTS)
@pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])
def test_steps_equal_torchs_optimizer_on_cpu(hpu_mode, case, dtype):
    ours, theirs, kwargs, second_group = TORCH_COUNTERPARTS[case]
    expected = _model(dtype)
    actual = copy.deepcopy(expected).to("hpu")
    reference = theirs(_groups(expected, **second_group), **kwargs)
    optimizer = ours(_groups(actual, **second_group), **kwargs)
    assert isinstance(optimizer, torch.optim.Optimizer)
    for step in range(STEPS):
        _train(expected, reference, range(step, step + 1))
        _train(actual, optimizer, range(step, step + 1))
        _assert_same_parameters(actual, expected, dtype)


@pytest.mark.parametrize("case", TORCH_COUNTERPARTS)
def test_state_dict_round_trip_continues_the_same_run(case):
    ours, _, kwargs, second_group = TORCH_COUNTERPARTS[case]
    model = _model(torch.float32).to("hpu")
    optimizer = ours(_groups(model, **second_group), **kwargs)
    _train(model, optimizer, range(2))
    saved_model, saved = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    _train(model, optimizer, range(2, 4))

    resumed_model = _model(torch.float32).to("hpu")
    resumed_model.load_state_dict(saved_model)
    resumed = ours(_groups(resumed_model, **second_group), **kwargs)
    resumed.load_state_dict(saved)
    _train(resumed_model, resumed, range(2, 4))
    for a, e in zip(resumed_model.parameters(), model.parameters()):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


@pytest.mark.parametrize("optimizer_class", [FusedSGD, FusedAdamW, FusedAdagrad, FusedLamb])
def test_zero_grad_clears_the_gradients(optimizer_class):
    model = _model(torch.float32).to("hpu")
    optimizer = optimizer_class(model.parameters(), lr=0.1)
    _backward(model, 0)
    optimizer.zero_grad()
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


def test_fused_adamw_without_bias_correction_and_with_fp32_moments():
    model = _model(torch.bfloat16).to("hpu")
    optimizer = FusedAdamW(model.parameters(), lr=0.01, bias_correction=False, moments_dtype=torch.float32)
    expected = {name: p.detach().cpu().float() for name, p in model.named_parameters()}
    moments = {name: (torch.zeros_like(p), torch.zeros_like(p)) for name, p in expected.items()}
    for step in range(STEPS):
        _train(model, optimizer, range(step, step + 1))
        for name, p in model.named_parameters():
            m, v = moments[name]
            grad = p.grad.cpu().float()
            m.mul_(0.9).add_(grad, alpha=0.1)
            v.mul_(0.999).addcmul_(grad, grad, value=0.001)
            expected[name] -= 0.01 * m / (v.sqrt() + 1e-6)  # no bias correction
            torch.testing.assert_close(p.detach().cpu().float(), expected[name], **_tolerance(torch.bfloat16))
    assert all(state["exp_avg"].dtype == torch.float32 for state in optimizer.state.values())


@pytest.mark.parametrize("moments_dtype", [None, torch.float32], ids=["one op per group", "per parameter"])
@pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])
def test_fused_adamw_adds_eps_as_gaudis_kernel(hpu_mode, moments_dtype):
    """eps on the root of the uncorrected second moment, the bias corrections in the step size (DeepSpeed's form); with
    a large eps that is far from torch's AdamW, which adds it to the corrected root."""
    lr, eps, decay = 0.01, 1e-2, 0.1
    model = _model(torch.float32).to("hpu")
    optimizer = FusedAdamW(model.parameters(), lr=lr, eps=eps, weight_decay=decay, moments_dtype=moments_dtype)
    expected = {name: p.detach().cpu().clone() for name, p in model.named_parameters()}
    moments = {name: (torch.zeros_like(p), torch.zeros_like(p)) for name, p in expected.items()}
    for step in range(1, STEPS + 1):
        _train(model, optimizer, range(step - 1, step))
        for name, p in model.named_parameters():
            m, v = moments[name]
            grad = p.grad.cpu()
            m.mul_(0.9).add_(grad, alpha=0.1)
            v.mul_(0.999).addcmul_(grad, grad, value=0.001)
            step_size = lr * math.sqrt(1 - 0.999**step) / (1 - 0.9**step)
            expected[name] = expected[name] * (1 - lr * decay) - step_size * m / (v.sqrt() + eps)
            torch.testing.assert_close(p.detach().cpu(), expected[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])
def test_fused_adamw_updates_a_group_in_one_device_op(hpu_mode):
    from virtual_hpu import accounting

    model = _model(torch.float32).to("hpu")
    optimizer = FusedAdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    _train(model, optimizer, range(1))
    _backward(model, 1)
    accounting.reset()
    optimizer.step()
    # the op, and the step size and weight decay as device tensors (eager) or the step size alone (lazy)
    assert accounting.counters()["ops"] <= 3 < len(list(model.parameters()))


def test_fused_adamw_keeps_fp8_moments_with_a_scale():
    expected = _model(torch.float32)
    model = copy.deepcopy(expected).to("hpu")
    optimizer = FusedAdamW(model.parameters(), lr=0.01, moments_dtype=(torch.float8_e4m3fn, torch.float8_e5m2))
    reference = torch.optim.AdamW(expected.parameters(), lr=0.01, eps=1e-6, weight_decay=0)
    for step in range(STEPS):
        _train(model, optimizer, range(step, step + 1))
        _train(expected, reference, range(step, step + 1))
    state = optimizer.state[model[0].weight]
    assert state["exp_avg"].dtype == torch.float8_e4m3fn and state["exp_avg_sq"].dtype == torch.float8_e5m2
    assert state["exp_avg_scale"].shape == (1,) and state["exp_avg_scale"].item() != 1.0
    # fp8 moments (3 and 2 mantissa bits) move the weights close to fp32 AdamW, not to the same values
    for a, e in zip(model.parameters(), expected.parameters()):
        torch.testing.assert_close(a.detach().cpu(), e.detach(), rtol=0.0, atol=2e-3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_distributed_fused_adamw_steps_with_the_gradients_given(dtype):
    expected = _model(dtype)
    model = copy.deepcopy(expected).to("hpu")
    optimizer = DistributedFusedAdamW(list(model.parameters()), lr=0.01, weight_decay=0.1)
    reference = torch.optim.AdamW(expected.parameters(), lr=0.01, eps=1e-6, weight_decay=0.1)
    for step in range(STEPS):
        for m in (model, expected):
            m.zero_grad()
            _backward(m, step)
        optimizer.step([p.grad for p in model.parameters()])
        reference.step()
        _assert_same_parameters(model, expected, dtype)
    with pytest.raises(RuntimeError, match="step_param"):
        optimizer.step_param(model[0].weight, model[0].weight.grad)


def _reference_lamb(params, grads, states, settings, step, max_grad_norm, use_lamb, betas=(0.9, 0.999), eps=1e-6):
    """A LAMB step as the paper and the bridge's docstring describe it, on CPU in fp64: global-norm clipping, Adam
    moments, decoupled weight decay, and the layer-wise trust ratio ‖w‖ / ‖update‖. ``settings``: each parameter's
    group's ``(lr, weight_decay)``."""
    global_norm = math.sqrt(sum(float(g.double().square().sum()) for g in grads))
    clip = global_norm / max_grad_norm if global_norm > max_grad_norm else 1.0
    beta1, beta2 = betas
    for w, g, (m, v), (lr, weight_decay) in zip(params, grads, states, settings):
        g = g.double() / clip
        m.mul_(beta1).add_((1 - beta1) * g)
        v.mul_(beta2).add_((1 - beta2) * g * g)
        update = (m / (1 - beta1**step)) / ((v / (1 - beta2**step)).sqrt() + eps) + weight_decay * w
        trust = 1.0
        if weight_decay != 0 or use_lamb:
            update_norm = float(update.norm())
            trust = float(w.norm()) / update_norm if update_norm > 0 else 1.0
        w.sub_(lr * trust * update)


@pytest.mark.parametrize("use_lamb", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])
def test_fused_lamb_equals_the_published_algorithm(hpu_mode, dtype, use_lamb):
    model = _model(dtype).to("hpu")
    # the first layer's group has no weight decay: it takes the trust ratio only with use_lamb
    groups = [{"params": model[0].parameters(), "weight_decay": 0.0}, {"params": model[2].parameters(), "lr": 0.05}]
    optimizer = FusedLamb(groups, lr=0.02, weight_decay=0.01, max_grad_norm=0.05, use_lamb=use_lamb)
    params = [p.detach().cpu().double() for p in model.parameters()]
    states = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    settings = [(0.02, 0.0), (0.02, 0.0), (0.05, 0.01), (0.05, 0.01)]
    for step in range(1, STEPS + 1):
        _train(model, optimizer, range(step, step + 1))
        grads = [p.grad.cpu() for p in model.parameters()]
        assert math.sqrt(sum(float(g.double().square().sum()) for g in grads)) > 0.05  # clipping is exercised
        _reference_lamb(params, grads, states, settings, step, max_grad_norm=0.05, use_lamb=use_lamb)
        for p, e in zip(model.parameters(), params):
            torch.testing.assert_close(p.detach().cpu().double(), e, **_tolerance(dtype))
            if dtype == torch.bfloat16:
                e.copy_(p.detach().cpu().double())  # the reference continues from the rounded weights
    assert [group["step"] for group in optimizer.param_groups] == [STEPS, STEPS]


def _reference_lars_momentum(params, grads, buffers, lars_mask, lr, momentum, weight_decay, eeta=0.001, eps=1e-8):
    """A LARS step with momentum as in MLPerf's ResNet (TensorFlow's LARS optimizer), on CPU in fp64."""
    for w, g, buffer, lars in zip(params, grads, buffers, lars_mask):
        g = g.double()
        scaled = lr * g
        if lars:
            w_norm, g_norm = float(w.norm()), float(g.norm())
            trust = eeta * w_norm / (g_norm + weight_decay * w_norm + eps) if w_norm > 0 and g_norm > 0 else 1.0
            scaled = lr * trust * (g + weight_decay * w)
        buffer.mul_(momentum).sub_(scaled)
        w.add_(buffer)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])
def test_fused_lars_around_resource_apply_momentum_equals_lars_with_momentum(hpu_mode, dtype):
    model = _model(dtype).to("hpu")
    lars_mask = [1, 0, 1, 0]  # LARS on the weights, plain scaled steps on the biases (the MLPerf ResNet split)
    inner = FusedResourceApplyMomentum(model.parameters(), lr=0.5, momentum=0.9, weight_decay=0.01)
    optimizer = FusedLars(inner, lars_mask, eeta=0.02)
    params = [p.detach().cpu().double() for p in model.parameters()]
    buffers = [torch.zeros_like(p) for p in params]
    for step in range(STEPS):
        optimizer.zero_grad()
        _backward(model, step)
        grads = [p.grad.cpu() for p in model.parameters()]
        optimizer.step()
        _reference_lars_momentum(params, grads, buffers, lars_mask, 0.5, 0.9, 0.01, eeta=0.02)
        for p, e in zip(model.parameters(), params):
            torch.testing.assert_close(p.detach().cpu().double(), e, **_tolerance(dtype))
            if dtype == torch.bfloat16:
                e.copy_(p.detach().cpu().double())
    assert inner.param_groups[0]["weight_decay"] == 0.01  # given back to the wrapped optimizer after the step


def test_fused_lars_shares_groups_and_state_with_the_wrapped_optimizer_also_after_loading():
    model = _model(torch.float32).to("hpu")
    optimizer = FusedLars(FusedResourceApplyMomentum(model.parameters(), lr=0.5, momentum=0.9), [1, 0, 1, 0])
    _train(model, optimizer, range(2))
    saved = copy.deepcopy(optimizer.state_dict())
    resumed = FusedLars(FusedResourceApplyMomentum(model.parameters(), lr=0.5, momentum=0.9), [1, 0, 1, 0])
    resumed.load_state_dict(saved)
    assert resumed.param_groups is resumed.optim.param_groups and resumed.state is resumed.optim.state
    buffer = resumed.optim.state[model[0].weight]["momentum_buffer"]
    torch.testing.assert_close(buffer, optimizer.state[model[0].weight]["momentum_buffer"])
    scheduler = torch.optim.lr_scheduler.StepLR(resumed, step_size=1, gamma=0.5)
    _train(model, resumed, range(2, 3))
    scheduler.step()
    assert resumed.optim.param_groups[0]["lr"] == 0.25


def test_resource_apply_momentum_adds_the_scaled_steps_it_is_given():
    param = nn.Parameter(torch.tensor([1.0, 2.0], device="hpu"))
    optimizer = FusedResourceApplyMomentum([param], lr=123.0, momentum=0.5)  # lr is the wrapper's business
    for expected in ([0.9, 1.9], [0.75, 1.75]):
        param.grad = torch.full((2,), 0.1, device="hpu")
        optimizer.step()
        torch.testing.assert_close(param.detach().cpu(), torch.tensor(expected))


@pytest.mark.parametrize("case", TORCH_COUNTERPARTS)
def test_lr_schedulers_drive_the_learning_rate(case):
    ours, theirs, kwargs, _ = TORCH_COUNTERPARTS[case]
    expected = _model(torch.float32)
    actual = copy.deepcopy(expected).to("hpu")
    optimizers = [ours(actual.parameters(), **kwargs), theirs(expected.parameters(), **kwargs)]
    schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.3) for o in optimizers]
    for step in range(STEPS):
        for model, optimizer, scheduler in zip((actual, expected), optimizers, schedulers):
            _train(model, optimizer, range(step, step + 1))
            scheduler.step()
    _assert_same_parameters(actual, expected, torch.float32)


@pytest.mark.parametrize("optimizer_class", [Adam, AdamW])
@pytest.mark.parametrize("hpu_mode", ["lazy"])
def test_markstep_adam_cuts_the_graph_around_each_groups_state_set_up(hpu_mode, optimizer_class):
    model = _model(torch.float32).to("hpu")
    optimizer = optimizer_class(_groups(model))
    _backward(model, 0)
    accounting.reset()
    optimizer.step()
    assert accounting.counters()["mark_steps"] == 2 * len(optimizer.param_groups)


# whether the bridge cuts the graph after the update too (FusedAdagrad leaves it pending for the next cut)
CUT_AFTER_THE_UPDATE = {FusedSGD: True, FusedAdamW: True, FusedAdagrad: False, FusedLamb: True}


@pytest.mark.parametrize("optimizer_class", list(CUT_AFTER_THE_UPDATE))
@pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])
def test_fused_optimizers_cut_the_lazy_graph_where_the_bridge_does(hpu_mode, optimizer_class):
    model = _model(torch.float32).to("hpu")
    optimizer = optimizer_class(model.parameters(), lr=0.1)
    accounting.reset()
    _backward(model, 0)
    optimizer.step()
    counts = accounting.counters()
    if hpu_mode == "eager":
        assert counts["mark_steps"] == 0
        return
    # the backward's ops are a graph of their own, before the update
    assert counts["mark_steps"] >= 1 and counts["graphs"] >= 1 and counts["host_syncs"] == 0
    assert (counts["ops_since_cut"] == 0) == CUT_AFTER_THE_UPDATE[optimizer_class]


def test_the_optimizers_module_exports_the_bridges_names():
    assert set(hpex_optimizers.__all__) == {
        "Adam",
        "AdamW",
        "FusedAdagrad",
        "FusedAdamW",
        "FusedLamb",
        "FusedLars",
        "FusedResourceApplyMomentum",
        "FusedSGD",
    }
    from habana_frameworks.torch.hpex.optimizers import SparseAdagrad, SparseSGD

    for module in (SparseSGD, SparseAdagrad):
        with pytest.raises(NotImplementedError, match="does not model"):
            module.forward()


@pytest.mark.usefixtures("fresh_compilation_state")
@pytest.mark.parametrize("case", ["sgd-momentum", "adamw", "adagrad"])
def test_steps_of_a_compiled_model_equal_torchs_optimizer_on_cpu(case):
    ours, theirs, kwargs, second_group = TORCH_COUNTERPARTS[case]
    expected = _model(torch.float32)
    actual = copy.deepcopy(expected).to("hpu")
    compiled = torch.compile(actual, backend="hpu_backend")
    reference = theirs(_groups(expected, **second_group), **kwargs)
    optimizer = ours(_groups(actual, **second_group), **kwargs)
    step = torch.compile(optimizer.step, backend="hpu_backend")
    for index in range(STEPS):
        _train(expected, reference, range(index, index + 1))
        optimizer.zero_grad()
        _backward(compiled, index)
        step()
    _assert_same_parameters(actual, expected, torch.float32)


@pytest.mark.usefixtures("fresh_compilation_state")
@pytest.mark.parametrize("optimizer_class", [FusedLamb, FusedAdamW])
def test_a_compiled_model_clipped_and_averaged_trains_as_in_eager(optimizer_class):
    from habana_frameworks.torch.hpex.movingavrg import FusedEMA
    from habana_frameworks.torch.hpex.normalization import FusedClipNorm

    def train(compiled: bool) -> list:
        model = _model(torch.float32).to("hpu")
        optimizer = optimizer_class(model.parameters(), lr=0.01)
        clip, ema = FusedClipNorm(model.parameters(), 0.1), FusedEMA(model, decay=0.9, updates=4000)
        runner = torch.compile(model, backend="hpu_backend") if compiled else model
        for step in range(STEPS):
            optimizer.zero_grad()
            _backward(runner, step)
            clip.clip_norm(model.parameters())
            optimizer.step()
            ema.update(model)
        return [p.detach().cpu() for p in (*model.parameters(), *ema.ema.parameters())]

    for compiled, eager in zip(train(compiled=True), train(compiled=False)):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
