"""fp8 on the virtual Gaudi: the bridge's fp8 ops, Transformer Engine's Linear, recipes and scaling state."""

import copy
import io

import pytest
import torch
from habana_frameworks.torch.hpex.experimental import transformer_engine as te
from habana_frameworks.torch.hpex.experimental.transformer_engine import recipe
from habana_frameworks.torch.hpex.experimental.transformer_engine.fp8 import FP8GlobalStateManager
from torch._subclasses import FakeTensorMode
from torch.utils._pytree import tree_map

from tests_virtual_hpu.amx_host import ONEDNN_ERROR, simulated_amx_host


def test_cast_to_fp8_saturates_to_the_gaudi2_range_and_rounds():
    x = torch.tensor([1000.0, -1000.0, 1.0, 0.3, 100.0], device="hpu")
    for dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        quantized, amax = torch.ops.hpu.cast_to_fp8_v2(x, None, False, True, dtype)
        assert quantized.dtype == dtype and quantized.device.type == "hpu"
        assert quantized.float().tolist()[:3] == [240.0, -240.0, 1.0]  # Gaudi2's e4m3 holds at most 240
        assert quantized.float()[3].item() == pytest.approx(0.3, rel=2**-4) and quantized.float()[3].item() != 0.3
        assert amax.item() == 1000.0
    e5m2, _ = torch.ops.hpu.cast_to_fp8_v2(x, torch.tensor(2.0, device="hpu"), False, False, torch.float8_e5m2)
    assert e5m2.float().tolist()[:3] == [2048.0, -2048.0, 2.0]


def test_cast_round_trip_and_scalar_overloads():
    x = torch.randn(64, device="hpu")
    quantized, _ = torch.ops.hpu.cast_to_fp8_v2.scalar(x, 16.0, False, False, torch.float8_e4m3fn)
    restored = torch.ops.hpu.cast_from_fp8.scalar(quantized, 1 / 16.0, torch.bfloat16)
    assert restored.dtype == torch.bfloat16
    torch.testing.assert_close(restored.float(), x, rtol=2**-3, atol=2**-9)
    assert not torch.equal(restored.float(), x)  # the values really went through fp8


def test_stochastic_rounding_is_unbiased_between_neighbours():
    x = torch.full((20000,), 1.0 + 2**-5, device="hpu")  # a quarter of the way from 1 to 1 + 2**-3
    quantized, _ = torch.ops.hpu.cast_to_fp8_v2(x, None, True, False, torch.float8_e4m3fn)
    values = quantized.float()
    assert set(values.unique().tolist()) == {1.0, 1.125}
    assert values.mean().item() == pytest.approx(1.0 + 2**-5, abs=2e-3)


def test_fp8_gemm_matches_the_product_of_the_dequantized_operands():
    torch.manual_seed(0)
    a, b = torch.randn(8, 32, device="hpu"), torch.randn(16, 32, device="hpu")
    bias = torch.randn(16, device="hpu")
    a8, _ = torch.ops.hpu.cast_to_fp8_v2(a, torch.tensor(8.0, device="hpu"), False, False, torch.float8_e4m3fn)
    b8, _ = torch.ops.hpu.cast_to_fp8_v2(b, torch.tensor(4.0, device="hpu"), False, False, torch.float8_e4m3fn)
    inv_a, inv_b = torch.tensor(1 / 8.0, device="hpu"), torch.tensor(1 / 4.0, device="hpu")
    out = torch.ops.hpu.fp8_gemm_v2(a8, False, b8, True, None, torch.bfloat16, inv_a, inv_b, bias, False)
    assert out.dtype == torch.bfloat16 and out.shape == (8, 16)
    expected = (a8.float() / 8) @ (b8.float() / 4).t() + bias
    torch.testing.assert_close(out.float(), expected, rtol=2**-7, atol=1e-2)
    exact = a @ b.t() + bias
    assert (out.float() - exact).norm() / exact.norm() < 0.05


def _fp8(*shape: int, dtype: torch.dtype = torch.float8_e4m3fnuz) -> torch.Tensor:
    return torch.randn(*shape, device="hpu").mul(4).to(dtype)


@pytest.mark.parametrize(
    ("a_shape", "trans_a", "b_shape", "trans_b"),
    [
        ((3, 7), False, (7, 5), False),
        ((7, 3), True, (5, 7), True),
        ((2, 3, 7), False, (5, 7), True),  # a batch of inputs times one weight
        ((2, 7, 3), True, (1, 7, 5), False),  # batch dimensions broadcast
        ((4, 1, 3, 7), False, (2, 7, 5), False),
    ],
)
def test_fp8_gemm_is_the_float64_product_rounded_once(a_shape, trans_a, b_shape, trans_b):
    """fp8 products are exact in float32 and only the sums round, so the GEMM agrees with float64 to fp32 rounding;
    for every layout, with per-tensor and per-channel scales, bias and accumulation."""
    torch.manual_seed(0)
    a, b = _fp8(*a_shape), _fp8(*b_shape, dtype=torch.float8_e5m2)
    columns = b_shape[-2] if trans_b else b_shape[-1]
    scale_a, scale_b = torch.tensor(0.25, device="hpu"), torch.rand(columns, device="hpu")
    bias = torch.randn(columns, device="hpu")
    a64, b64 = a.cpu().double(), b.cpu().double()  # on the CPU: Gaudi computes float64 in float32
    a64, b64 = a64.transpose(-2, -1) if trans_a else a64, b64.transpose(-2, -1) if trans_b else b64
    expected = torch.matmul(a64, b64) * 0.25 * scale_b.cpu().double() + bias.cpu().double()
    out = torch.ops.hpu.fp8_gemm_v2(a, trans_a, b, trans_b, None, torch.float32, scale_a, scale_b, bias, False)
    assert out.shape == expected.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.cpu().double(), expected, rtol=1e-6, atol=1e-5)
    accumulated = torch.ops.hpu.fp8_gemm_v2.scalar(a, trans_a, b, trans_b, out, torch.float32, 0.25, 1.0, None, True)
    torch.testing.assert_close(accumulated.cpu().double(), expected + torch.matmul(a64, b64) / 4, rtol=1e-6, atol=1e-5)


def test_fp8_gemm_refuses_mismatched_shapes_with_the_bridges_message():
    with pytest.raises(RuntimeError, match="common dimension sizes of matmul inputs should be the same. Got 7 and 5"):
        torch.ops.hpu.fp8_gemm_v2(_fp8(3, 7), False, _fp8(5, 7), False, None, torch.bfloat16)
    with pytest.raises(RuntimeError, match="batch dimensions of matmul inputs should be the same or 1. Got 2 and 3"):
        torch.ops.hpu.fp8_gemm_v2(_fp8(2, 3, 7), False, _fp8(3, 7, 5), False, None, torch.bfloat16)


def test_fp8_ops_do_not_use_the_hosts_fp8_gemm():
    """On AMX hosts the host's ``torch._scaled_mm`` refuses float8_e4m3fnuz, Gaudi2's e4m3: the ops still work there
    and compute the same as here."""
    torch.manual_seed(0)
    a, b, bias = _fp8(9, 13), _fp8(5, 13), torch.randn(5, device="hpu")
    one = torch.ones((), device="hpu")
    scales = (torch.tensor(0.5, device="hpu"), torch.tensor(0.125, device="hpu"))
    expected = torch.ops.hpu.fp8_gemm_v2(a, False, b, True, None, torch.bfloat16, *scales, bias, False)
    linear, x = te.Linear(13, 5), torch.randn(3, 9, 13, device="hpu")
    linear_state = copy.deepcopy(linear.state_dict())
    hybrid = recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID)

    def train() -> tuple[torch.Tensor, ...]:
        linear.load_state_dict(linear_state)
        for _ in range(2):  # the first step measures, the second casts with the scales it found
            linear.zero_grad()
            with te.fp8_autocast(enabled=True, fp8_recipe=hybrid):
                out = linear(x)
            out.float().square().sum().backward()
        return out, linear.weight.grad, linear.bias.grad, *linear.fp8_state.state_dict().values()

    expected_training = train()
    assert linear.fp8_state.scale.ne(1).all()
    with simulated_amx_host():
        with pytest.raises(RuntimeError, match=ONEDNN_ERROR):
            torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        actual = torch.ops.hpu.fp8_gemm_v2(a, False, b, True, None, torch.bfloat16, *scales, bias, False)
        actual_training = train()
    assert torch.equal(actual, expected)
    for actual_tensor, expected_tensor in zip(actual_training, expected_training):
        assert torch.equal(actual_tensor, expected_tensor)


def _gemm(*shapes: tuple[int, ...], trans_a: bool = False, trans_b: bool = False, **kwargs):
    a, b = _fp8(*shapes[0]), _fp8(*shapes[1], dtype=torch.float8_e5m2)
    return torch.ops.hpu.fp8_gemm_v2, (a, trans_a, b, trans_b, None, kwargs.get("out_dtype", torch.bfloat16))


_OP_CALLS = {
    "cast_to_fp8_v2 amax": lambda: (
        torch.ops.hpu.cast_to_fp8_v2,
        (torch.randn(3, 7, 5, device="hpu"), torch.tensor(2.0, device="hpu"), False, True, torch.float8_e4m3fnuz),
    ),
    "cast_to_fp8_v2 no amax": lambda: (
        torch.ops.hpu.cast_to_fp8_v2,
        (torch.randn(3, 7, device="hpu", dtype=torch.bfloat16), None, False, False, torch.float8_e5m2),
    ),
    "cast_to_fp8_v2.scalar": lambda: (
        torch.ops.hpu.cast_to_fp8_v2.scalar,
        (torch.randn(11, device="hpu"), 4.0, True, True, torch.float8_e4m3fn),
    ),
    "cast_from_fp8": lambda: (
        torch.ops.hpu.cast_from_fp8,
        (_fp8(2, 3, 7), torch.tensor(0.5, device="hpu"), torch.bfloat16),
    ),
    "cast_from_fp8.scalar": lambda: (torch.ops.hpu.cast_from_fp8.scalar, (_fp8(3, 7), 0.5, torch.float32)),
    "gemm 3x7 @ 7x5": lambda: _gemm((3, 7), (7, 5)),
    "gemm trans_A": lambda: _gemm((7, 3), (7, 5), trans_a=True, out_dtype=torch.float32),
    "gemm trans_B": lambda: _gemm((3, 7), (5, 7), trans_b=True),
    "gemm trans_A trans_B": lambda: _gemm((7, 3), (5, 7), trans_a=True, trans_b=True),
    "gemm batched input": lambda: _gemm((2, 3, 7), (5, 7), trans_b=True),
    "gemm broadcast batch": lambda: _gemm((2, 1, 3, 7), (4, 7, 5)),
    "gemm vector": lambda: _gemm((7,), (7, 5)),
    "gemm.scalar": lambda: (
        torch.ops.hpu.fp8_gemm_v2.scalar,
        (_fp8(3, 7), False, _fp8(5, 7), True, None, torch.float32, 0.5, 2.0),
    ),
    "conv2d_fp8": lambda: (
        torch.ops.hpu.conv2d_fp8,
        (_fp8(2, 4, 9, 11), _fp8(6, 2, 3, 2), None, [2, 1], [1, 0], [2, 1], 2, None),
    ),
    "conv2d_fp8.scalar": lambda: (
        torch.ops.hpu.conv2d_fp8.scalar,
        (_fp8(3, 7, 5), _fp8(4, 3, 3, 3), torch.randn(4, device="hpu"), [2], [1], [1], 1, torch.float32, 0.5, 0.5),
    ),
}


@pytest.mark.parametrize("call", _OP_CALLS.values(), ids=_OP_CALLS.keys())
def test_fake_kernels_give_the_real_kernels_shapes_and_dtypes(call):
    """What ``torch.compile`` traces with: the bridge's shape rules (transposes, broadcast batch dimensions, a 0-dim
    amax only when asked for), not CUDA's; no sizes need to be multiples of 16."""
    torch.manual_seed(0)
    op, args = call()
    expected = op(*args)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_args = tree_map(lambda a: mode.from_tensor(a) if isinstance(a, torch.Tensor) else a, args)
        actual = op(*fake_args)
    for fake, real in zip(*(t if isinstance(t, tuple) else (t,) for t in (actual, expected))):
        assert (fake.shape, fake.dtype, fake.device) == (real.shape, real.dtype, real.device)


def test_fake_gemm_refuses_mismatched_shapes():
    with FakeTensorMode() as mode:
        a, b = mode.from_tensor(_fp8(3, 7)), mode.from_tensor(_fp8(5, 7))
        with pytest.raises(RuntimeError, match="Got 7 and 5"):
            torch.ops.hpu.fp8_gemm_v2(a, False, b, False, None, torch.bfloat16)


def test_conv2d_fp8_matches_the_convolution_of_the_dequantized_operands():
    """The op Intel Neural Compressor runs for quantized ``Conv2d`` layers, with tensor and scalar scales."""
    torch.manual_seed(0)
    x, w, bias = (
        torch.randn(2, 3, 8, 8, device="hpu"),
        torch.randn(4, 3, 3, 3, device="hpu"),
        torch.randn(4, device="hpu"),
    )
    x8, _ = torch.ops.hpu.cast_to_fp8_v2(x, torch.tensor(16.0, device="hpu"), False, False, torch.float8_e4m3fn)
    w8, _ = torch.ops.hpu.cast_to_fp8_v2(w, torch.tensor(8.0, device="hpu"), False, False, torch.float8_e4m3fn)
    expected = torch.nn.functional.conv2d(x8.float() / 16, w8.float() / 8, bias, [1, 1], [1, 1])
    inv_x, inv_w = torch.tensor(1 / 16.0, device="hpu"), torch.tensor(1 / 8.0, device="hpu")
    out = torch.ops.hpu.conv2d_fp8(x8, w8, bias, [1, 1], [1, 1], [1, 1], 1, torch.bfloat16, inv_x, inv_w)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 4, 8, 8)
    torch.testing.assert_close(out.float(), expected, rtol=2**-7, atol=2e-2)
    scalar = torch.ops.hpu.conv2d_fp8.scalar(
        x8, w8, bias, [1, 1], [1, 1], [1, 1], 1, torch.float32, scale_input=1 / 16.0, scale_weight=1 / 8.0
    )
    torch.testing.assert_close(scalar, expected)
    exact = torch.nn.functional.conv2d(x, w, bias, padding=1)
    assert (out.float() - exact).norm() / exact.norm() < 0.05
    with pytest.raises(RuntimeError, match="conv2d_fp8: input must be an fp8 tensor"):
        torch.ops.hpu.conv2d_fp8(x, w8, None, [1, 1], [0, 0], [1, 1], 1, None, None, None)


def test_delayed_scaling_defaults_and_assertions():
    default = recipe.DelayedScaling()
    assert (default.margin, default.interval, default.fp8_format, default.amax_history_len) == (
        0,
        1,
        recipe.Format.E5M2,
        1,
    )
    assert (default.amax_compute_algo, default.reduce_amax) == ("most_recent", True)
    with pytest.raises(AssertionError, match="E4M3"):
        recipe.DelayedScaling(fp8_format=recipe.Format.E4M3)
    with pytest.raises(AssertionError, match="interval"):
        recipe.DelayedScaling(interval=0)


def _train_steps(linear, inputs, fp8_recipe):
    for x in inputs:
        with te.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe):
            out = linear(x)
        out.float().sum().backward()
    return out


def test_scales_follow_the_recipe_interval_history_and_margin():
    torch.manual_seed(0)
    linear = te.Linear(32, 16)
    amaxes = [1.0, 4.0, 2.0, 0.5]
    inputs = [torch.full((4, 32), a, device="hpu") for a in amaxes]
    fp8_recipe = recipe.DelayedScaling(
        margin=1, interval=2, fp8_format=recipe.Format.HYBRID, amax_history_len=3, amax_compute_algo="max"
    )
    _train_steps(linear, inputs[:3], fp8_recipe)  # updates at steps 2 and 3 close steps 1 and 2
    state = linear.fp8_state
    # one update per step; at the 2nd update (interval 2) the scale is the power of two for max(1, 4), over 2**margin
    assert state.amax_history[:, 0].tolist() == [2.0, 4.0, 1.0]
    assert state.scale[0].item() == 2.0 ** (int(torch.log2(torch.tensor(240 / 4.0)).floor()) - 1)
    assert state.scale_inv[0].item() == 1 / state.scale[0].item()
    # the gradient is E5M2 (range 57344) under HYBRID; the sum's gradient is 1
    assert state.scale[2].item() == 2.0**15 / 2
    scale_before = state.scale.clone()
    _train_steps(linear, inputs[3:], fp8_recipe)  # 3rd update: not a multiple of the interval
    assert torch.equal(state.scale, scale_before)
    assert state.amax_history[:, 0].tolist() == [0.5, 2.0, 4.0]


def test_linear_output_is_bf16_close_to_fp32_and_state_survives_save_load():
    torch.manual_seed(0)
    linear = te.Linear(64, 32)
    reference = torch.nn.Linear(64, 32, device="hpu")
    reference.load_state_dict({"weight": linear.weight, "bias": linear.bias})
    x = torch.randn(16, 64, device="hpu")
    out = _train_steps(linear, [x, x], recipe.DelayedScaling(amax_history_len=2))
    assert out.dtype == torch.bfloat16
    # the default format, E5M2, keeps 2 mantissa bits (up to 12.5% error per operand); HYBRID's E4M3 forward keeps 3
    error = (out.float() - reference(x)).norm() / reference(x).norm()
    assert 0 < error < 0.1
    hybrid = te.Linear(64, 32)
    hybrid.load_state_dict(linear.state_dict())
    out_hybrid = _train_steps(hybrid, [x, x], recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID))
    assert (out_hybrid.float() - reference(x)).norm() / reference(x).norm() < error / 1.5
    assert linear.weight.grad is not None and linear.bias.grad is not None

    buffer = io.BytesIO()
    torch.save(linear.state_dict(), buffer)
    buffer.seek(0)
    restored = te.Linear(64, 32)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    for key, value in linear.fp8_state.state_dict().items():
        assert torch.equal(restored.fp8_state.state_dict()[key], value), key
    assert restored.fp8_state.scale.ne(1).any()


def test_outside_fp8_autocast_linear_is_a_plain_linear():
    linear = te.Linear(16, 8)
    x = torch.randn(2, 16, device="hpu")
    torch.testing.assert_close(linear(x), torch.nn.functional.linear(x, linear.weight, linear.bias))


def test_fp8_global_state_manager_reflects_fp8_autocast():
    """Intel's Transformer Engine API (lightning-habana's tests use it) on the same state as the module's functions."""
    manager = te.fp8.FP8GlobalStateManager
    assert manager is FP8GlobalStateManager
    assert manager.is_fp8_available() == te.fp8.is_fp8_available() == (True, "")
    assert manager.get_fp8_autocast_state() == (False, None, None, False)
    fp8_recipe, group = recipe.DelayedScaling(margin=2), object()
    with te.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe, fp8_group=group, force_measurement=True):
        assert manager.is_fp8_enabled() and te.fp8.is_fp8_enabled()
        assert manager.get_fp8_recipe() is fp8_recipe and manager.get_fp8_group() is group
        assert manager.get_manual_measurement_mode() is True
        assert manager.is_first_fp8_module() and not manager.is_first_fp8_module()
        with te.fp8_autocast(enabled=False):
            assert not manager.is_fp8_enabled()
            assert manager.get_fp8_recipe() == recipe.DelayedScaling() and manager.get_fp8_group() is None
            assert manager.get_manual_measurement_mode() is True  # set by the outermost block
        assert manager.is_fp8_enabled() and manager.get_fp8_recipe() is fp8_recipe
    assert not manager.is_fp8_enabled() and manager.get_fp8_recipe() is None and manager.get_fp8_group() is None
    assert te.fp8.get_fp8_recipe() == recipe.DelayedScaling()  # the module's function keeps its default

    saved = manager.get_fp8_autocast_state()  # the manual form of fp8_autocast, as Intel's context manager runs it
    manager.fp8_autocast_enter(enabled=True, fp8_recipe=fp8_recipe)
    assert manager.is_fp8_enabled() and manager.get_fp8_recipe() is fp8_recipe
    manager.set_fp8_autocast_state(saved)
    manager.fp8_autocast_exit()
    assert manager.get_fp8_autocast_state() == saved and not te.fp8.is_fp8_enabled()


def test_intel_neural_compressor_imports_hpex_and_detects_the_gaudi():
    from neural_compressor.torch.utils import auto_accelerator, environ

    assert environ.is_hpex_available()
    accelerator = auto_accelerator.HPU_Accelerator()
    assert accelerator.is_available()
    assert accelerator.get_inc_accelerator_type() == auto_accelerator.INCAcceleratorType.GAUDI2


@pytest.mark.parametrize("lazy", ["0", "1"])
def test_fp8_is_refused_on_first_generation_gaudi(python, lazy):
    result = python(
        """
        import virtual_hpu; virtual_hpu.activate()
        import torch
        from habana_frameworks.torch.hpex.experimental import transformer_engine as te
        for call in (
            lambda: torch.ops.hpu.cast_to_fp8_v2(torch.ones(2, device="hpu"), None, False, False, torch.float8_e5m2),
            lambda: te.fp8_autocast(enabled=True).__enter__(),
        ):
            try:
                call()
            except RuntimeError as error:
                print("refused:", error)
        print(te.fp8.FP8GlobalStateManager.is_fp8_available())
        """,
        VIRTUAL_HPU_GENERATION="GAUDI",
        PT_HPU_LAZY_MODE=lazy,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("refused: fp8 is not supported on GAUDI") == 2
    assert "(False, 'fp8 is not supported on GAUDI: it needs Gaudi2 or newer.')" in result.stdout


def test_gaudi3_uses_the_full_e4m3_range(python):
    result = python(
        """
        import virtual_hpu; virtual_hpu.activate()
        import torch
        from habana_frameworks.torch.hpex.experimental.transformer_engine import fp8
        q, _ = torch.ops.hpu.cast_to_fp8_v2(torch.tensor([1000.0], device="hpu"), None, False, False,
                                            torch.float8_e4m3fn)
        print(q.float().item(), fp8.fp8_dtype("E4M3"))
        """,
        VIRTUAL_HPU_GENERATION="GAUDI3",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["448.0", "torch.float8_e4m3fn"]
