"""``habana_frameworks.torch.hpex.normalization`` and ``movingavrg`` on the virtual Gaudi against their CPU
references: RMSNorm forward and backward, gradient clipping, the model EMA."""

import copy
import math

import pytest
import torch
from habana_frameworks.torch.hpex.movingavrg import FusedEMA
from habana_frameworks.torch.hpex.normalization import FusedClipNorm, FusedRMSNorm, RmsNormBwdMode
from torch import nn

DTYPES = [torch.float32, torch.bfloat16]


def _tolerance(dtype: torch.dtype) -> dict:
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


def _reference_rms_norm(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as published, in fp64 on CPU with autograd's gradients."""
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps) * gamma


def _rms_norm_case(dtype: torch.dtype):
    torch.manual_seed(0)
    x, gamma = torch.randn(2, 3, 8), torch.rand(8) + 0.5
    grad_out = torch.randn(2, 3, 8)
    x_ref, gamma_ref = x.double().requires_grad_(), gamma.double().requires_grad_()
    expected = _reference_rms_norm(x_ref, gamma_ref, 1e-6)
    expected.backward(grad_out.double())
    x_hpu = x.to("hpu", dtype).requires_grad_()
    gamma_hpu = gamma.to("hpu", dtype).requires_grad_()
    return (x_hpu, gamma_hpu, grad_out.to("hpu", dtype)), (expected, x_ref.grad, gamma_ref.grad)


def _assert_rms_norm(out, inputs, expected, dtype) -> None:
    (x, gamma, _), (expected_out, expected_dx, expected_dgamma) = inputs, expected
    assert out.dtype == x.grad.dtype == gamma.grad.dtype == dtype and out.device.type == "hpu"
    torch.testing.assert_close(out.detach().cpu().double(), expected_out.detach(), **_tolerance(dtype))
    torch.testing.assert_close(x.grad.cpu().double(), expected_dx, **_tolerance(dtype))
    torch.testing.assert_close(gamma.grad.cpu().double(), expected_dgamma, **_tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])
def test_fused_rms_norm_forward_and_backward_equal_rms_norm(hpu_mode, dtype):
    inputs, expected = _rms_norm_case(dtype)
    x, gamma, grad_out = inputs
    for use_stages, bwd_mode in [(True, 0), (False, RmsNormBwdMode.STATIC_CASE_WIDTH_PARTITIONING.value)]:
        x.grad = gamma.grad = None
        out = FusedRMSNorm.apply(x, gamma, 1e-6, use_stages, bwd_mode)
        out.backward(grad_out)
        _assert_rms_norm(out, inputs, expected, dtype)


@pytest.mark.usefixtures("fresh_compilation_state")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_rms_norm_compiles_with_the_hpu_backend(dtype):
    inputs, expected = _rms_norm_case(dtype)
    x, gamma, grad_out = inputs

    @torch.compile(backend="hpu_backend", fullgraph=True)
    def norm(x, gamma):
        return FusedRMSNorm.apply(x, gamma, 1e-6)

    out = norm(x, gamma)
    out.backward(grad_out)
    _assert_rms_norm(out, inputs, expected, dtype)


def _model_with_gradients(device: str, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).to(device, dtype)
    model(torch.randn(4, 6).to(device, dtype)).float().square().sum().mul(10).backward()
    model[2].bias.grad = None  # a parameter without gradient is left out
    return model


@pytest.mark.parametrize("max_norm", [0.5, 1e3], ids=["clipped", "unclipped"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])
def test_fused_clip_norm_equals_clip_grad_norm(hpu_mode, dtype, max_norm):
    expected_model = _model_with_gradients("cpu", dtype)
    model = _model_with_gradients("hpu", dtype)
    expected = torch.nn.utils.clip_grad_norm_(expected_model.parameters(), max_norm)
    clip = FusedClipNorm(model.parameters(), max_norm)
    total = clip.clip_norm(model.parameters())
    assert (expected > max_norm) == (max_norm == 0.5)
    # as the bridge's op: a one-element tensor in the parameters' dtype, on the device
    assert total.shape == (1,) and total.dtype == dtype and total.device.type == "hpu"
    torch.testing.assert_close(total.cpu()[0], expected, **_tolerance(dtype))
    for a, e in zip(model.parameters(), expected_model.parameters()):
        if e.grad is None:
            assert a.grad is None
        else:
            torch.testing.assert_close(a.grad.cpu(), e.grad, **_tolerance(dtype))


def test_fused_clip_norm_takes_one_tensor_and_returns_zero_without_gradients():
    model = _model_with_gradients("hpu", torch.float32)
    clip = FusedClipNorm(model.parameters(), 0.1)
    weight = model[0].weight
    expected = torch.linalg.vector_norm(weight.grad).cpu()
    torch.testing.assert_close(clip.clip_norm(weight).cpu()[0], expected)
    torch.testing.assert_close(torch.linalg.vector_norm(weight.grad).cpu(), torch.tensor(0.1), rtol=1e-4, atol=0)
    assert clip.clip_norm([model[2].bias]).item() == 0.0


@pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])
def test_fused_clip_norm_is_one_device_op_for_all_gradients(hpu_mode):
    """What makes it fused: the gradients are clipped by one op on the device, where torch's ``clip_grad_norm_``
    launches a norm and a multiplication per gradient (its per-tensor path, Gaudi's default)."""
    from virtual_hpu import accounting

    model = _model_with_gradients("hpu", torch.float32)
    clip = FusedClipNorm(model.parameters(), 0.5)
    accounting.reset()
    clip.clip_norm(model.parameters())
    fused = accounting.counters()["ops"]
    accounting.reset()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    unfused = accounting.counters()["ops"]
    gradients = sum(p.grad is not None for p in model.parameters())
    assert fused <= 2  # the op, and in eager mode the placeholder the total is written into
    assert unfused >= 2 * gradients


@pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])
def test_fused_clip_norm_kernels_part_on_a_nan_norm(hpu_mode):
    """Gaudi's two kernels part on a NaN total: the lazy one scales only where the total is above ``max_norm``, the
    eager one scales by the NaN, as torch does."""
    model = _model_with_gradients("hpu", torch.float32)
    model[0].weight.grad[0, 0] = float("nan")
    bias = model[0].bias.grad.cpu()
    total = FusedClipNorm(model.parameters(), 0.5).clip_norm(model.parameters())
    assert total.isnan().all()
    if hpu_mode == "lazy":
        torch.testing.assert_close(model[0].bias.grad.cpu(), bias)
    else:
        assert model[0].bias.grad.isnan().all()


def test_fused_clip_norm_op_refuses_other_norm_types():
    grads = [torch.ones(3, device="hpu"), torch.zeros(1, device="hpu")]
    with pytest.raises(RuntimeError, match="supports 2.0 only"):
        torch.ops.hpu.fused_clip_norm(grads, torch.ones(1, device="hpu"), 1.0)


def _ema_model(device: str, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).to(device, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hpu_mode", ["eager", "lazy"])
def test_fused_ema_equals_the_plain_ema_update(hpu_mode, dtype):
    model = _ema_model("hpu", dtype)
    ema = FusedEMA(model, decay=0.999, updates=1000)
    expected = {name: value.cpu().double() for name, value in model.state_dict().items()}
    for update in range(1001, 1004):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        model(torch.randn(3, 4, device="hpu", dtype=dtype))  # batch norm statistics and batch count move
        ema.update(model)
        decay = 0.999 * (1 - math.exp(-update / 2000))
        for name, value in model.state_dict().items():
            if value.dtype.is_floating_point:
                expected[name] = decay * expected[name] + (1 - decay) * value.cpu().double()
    assert ema.updates == 1003 and not ema.ema.training
    for name, value in ema.ema.state_dict().items():
        assert value.device.type == "hpu"
        if name.endswith("num_batches_tracked"):
            assert value.item() == 0  # integer entries keep the copy's value
        else:
            torch.testing.assert_close(value.cpu().double(), expected[name], **_tolerance(dtype), msg=name)


def test_fused_ema_copies_the_models_public_attributes():
    model = _ema_model("hpu", torch.float32)
    ema = FusedEMA(copy.deepcopy(model))
    model.names, model.stride, model._private = ["a"], 8, 1
    ema.update_attr(model, exclude=("stride",))
    assert ema.ema.names == ["a"] and not hasattr(ema.ema, "stride") and not hasattr(ema.ema, "_private")
