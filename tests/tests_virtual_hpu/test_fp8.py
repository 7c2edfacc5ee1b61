"""fp8 on the virtual Gaudi: the bridge's fp8 ops, Transformer Engine's Linear, recipes and scaling state."""

import io

import pytest
import torch
from habana_frameworks.torch.hpex.experimental import transformer_engine as te
from habana_frameworks.torch.hpex.experimental.transformer_engine import recipe


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
        """,
        VIRTUAL_HPU_GENERATION="GAUDI",
        PT_HPU_LAZY_MODE=lazy,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("refused: fp8 is not supported on GAUDI") == 2


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
