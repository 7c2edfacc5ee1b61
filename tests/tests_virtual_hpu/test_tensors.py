"""Tensor ops on hpu agree with the same ops on cpu, keep aliasing and keep their device index."""

import io

import pytest
import torch

UNARY = [
    "abs",
    "exp",
    "log1p",
    "sin",
    "tanh",
    "sigmoid",
    "relu",
    "neg",
    "sqrt",
    "floor",
    "cumsum0",
    "sort0",
    "softmax1",
    "argmax1",
    "norm",
    "t",
    "flip0",
    "nonzero",
    "unique",
]


def _apply(name: str, x: torch.Tensor):
    if name == "sqrt":
        return x.abs().sqrt()
    if name == "cumsum0":
        return x.cumsum(0)
    if name == "sort0":
        return x.sort(0).values
    if name == "softmax1":
        return x.softmax(1)
    if name == "argmax1":
        return x.argmax(1)
    if name == "flip0":
        return x.flip(0)
    if name == "nonzero":
        return (x > 0).nonzero()
    if name == "unique":
        return x.round().unique()
    return getattr(x, name)()


@pytest.mark.parametrize("name", UNARY)
def test_unary_ops_match_cpu(name):
    x = torch.randn(6, 5)
    expected = _apply(name, x)
    actual = _apply(name, x.to("hpu"))
    assert actual.device.type == "hpu"
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0, equal_nan=True)


def test_binary_reduction_and_indexing_ops_match_cpu():
    a, b = torch.randn(4, 6), torch.randn(6, 3)
    idx = torch.tensor([2, 0, 3])
    ha, hb, hidx = a.to("hpu"), b.to("hpu"), idx.to("hpu")
    pairs = [
        (a @ b, ha @ hb),
        (a + 2 * a, ha + 2 * ha),
        (torch.where(a > 0, a, -a), torch.where(ha > 0, ha, -ha)),
        (a[idx], ha[hidx]),
        (a.mean(1), ha.mean(1)),
        (a.max(0).values, ha.max(0).values),
        (torch.cat([a, a], 1), torch.cat([ha, ha], 1)),
        (torch.stack(a.unbind(0)), torch.stack(ha.unbind(0))),
        (a.view(6, 4).transpose(0, 1).contiguous(), ha.view(6, 4).transpose(0, 1).contiguous()),
        (torch.arange(7) * 3, torch.arange(7, device="hpu") * 3),
        (torch.linspace(0, 1, 5), torch.linspace(0, 1, 5, device="hpu")),
    ]
    for expected, actual in pairs:
        assert actual.device.type == "hpu"
        assert torch.equal(actual.cpu(), expected)


def test_index_put_and_scatter_write_in_place():
    x = torch.zeros(5, device="hpu")
    x[torch.tensor([1, 3], device="hpu")] = 7.0
    x.scatter_add_(0, torch.tensor([0, 0], device="hpu"), torch.ones(2, device="hpu"))
    assert x.tolist() == [2.0, 7.0, 0.0, 7.0, 0.0]


def test_in_place_through_views_reaches_the_base():
    base = torch.zeros(12, device="hpu")
    base.unfold(0, 4, 2).mul_(2)  # a view whose in-place write must land in `base`
    base.unfold(0, 4, 2).add_(1)
    expected = torch.zeros(12)
    expected.unfold(0, 4, 2).mul_(2)
    expected.unfold(0, 4, 2).add_(1)
    assert torch.equal(base.cpu(), expected)
    row = base.view(3, 4)[1]
    row.fill_(-1)
    assert base[4:8].tolist() == [-1.0] * 4
    assert row._base is not None and row.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


def test_out_variant_resizes_the_hpu_tensor():
    out = torch.empty(0, device="hpu")
    result = torch.add(torch.ones(3, device="hpu"), 1, out=out)
    assert result is out
    assert out.shape == (3,) and out.tolist() == [2.0, 2.0, 2.0]
    assert out.device == torch.device("hpu:0")


def test_device_index_is_kept():
    x = torch.arange(4.0).to("hpu:1")
    assert x.device == torch.device("hpu:1")
    y = (x * 2).sum()
    assert y.device == torch.device("hpu:1")
    assert torch.zeros(2, device="hpu:3").device == torch.device("hpu:3")
    moved = x.to("hpu:2")
    assert moved.device == torch.device("hpu:2") and moved.tolist() == [0.0, 1.0, 2.0, 3.0]
    with torch.hpu.device(5):
        assert torch.empty(1, device="hpu").device == torch.device("hpu:5")
    assert torch.empty(1, device="hpu").device == torch.device("hpu:0")


def test_invalid_device_index_is_refused():
    with pytest.raises(RuntimeError, match="hpu:8"):
        torch.zeros(1, device="hpu:8")


def test_autograd_matches_cpu():
    x = torch.randn(5, 4, requires_grad=True)
    hx = x.detach().to("hpu").requires_grad_()
    for t in (x, hx):
        (t.sin() * t.exp()).sum().backward()
    assert hx.grad.device.type == "hpu"
    assert torch.equal(hx.grad.cpu(), x.grad)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_is_refused(dtype):
    with pytest.raises(TypeError, match=f"Gaudi does not support {dtype} tensors on hpu .* on the CPU"):
        torch.zeros(2, dtype=dtype, device="hpu")
    with pytest.raises(TypeError, match="Gaudi does not support"):
        torch.ones(2, dtype=dtype).to("hpu")
    with pytest.raises(TypeError, match="Gaudi does not support"):
        torch.ones(2, device="hpu").to(dtype)


def test_float64_is_held_but_computed_in_float32():
    """Like the real bridge: float64 tensors exist on hpu, their values have float32 precision."""
    x = torch.tensor([1 / 3, 1 + 1e-10, 2.0**-140], dtype=torch.float64)
    as_float32 = x.float().double()
    assert not torch.equal(as_float32, x)
    moved = x.to("hpu")
    assert moved.dtype == torch.float64
    assert torch.equal(moved.cpu(), as_float32)
    # results of ops, in-place ops and casts on the device are rounded too
    assert torch.equal((moved / 7).cpu(), (as_float32 / 7).float().double())
    accumulated = torch.zeros(3, dtype=torch.float64, device="hpu").add_(moved / 7)
    assert torch.equal(accumulated.cpu(), (as_float32 / 7).float().double())
    cast = torch.tensor([1 / 3], device="hpu").double() * (1 / 3)
    assert torch.equal(cast.cpu(), (torch.tensor([1 / 3]).double() * (1 / 3)).float().double())


@pytest.mark.parametrize(
    ("source", "rounded"),
    [
        # wider than float32's 24-bit significand: rounded, as Gaudi stores it
        (torch.tensor([2**24 + 1], dtype=torch.int32), True),
        (torch.tensor([2**40 + 1], dtype=torch.int64), True),
        (torch.tensor([1 / 3], dtype=torch.float64), True),
        # every value of these fits in float32: copied as they are
        (torch.tensor([1 / 3], dtype=torch.float32), False),
        (torch.tensor([1 / 3], dtype=torch.bfloat16), False),
        (torch.tensor([-32767], dtype=torch.int16), False),
    ],
    ids=["int32", "int64", "float64", "float32", "bfloat16", "int16"],
)
def test_a_copy_into_float64_on_the_device_is_rounded_only_where_float32_cannot_hold_the_source(source, rounded):
    on_hpu = source.to("hpu", torch.float64)
    expected = source.double()
    if rounded:
        assert not torch.equal(expected.float().double(), expected)
        expected = expected.float().double()
    assert torch.equal(on_hpu.cpu(), expected)
    # from a device tensor too
    assert torch.equal(source.to("hpu").to(torch.float64).cpu(), expected)


def test_float64_warns_once_per_process(python):
    result = python(
        """
        import warnings, torch, virtual_hpu
        virtual_hpu.activate()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                torch.ones(2, dtype=torch.float64).to("hpu") * 2
        print(sum("computes torch.float64 tensors on hpu in torch.float32" in str(w.message) for w in caught))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "1"


def test_record_stream_is_accepted():
    tensor = torch.ones(3, device="hpu")
    tensor.record_stream(torch.hpu.current_stream())
    assert torch.equal(tensor.cpu(), torch.ones(3))


def test_printing_works_without_fp64():
    text = repr(torch.tensor([1.5, -2.25], device="hpu:2"))
    assert "1.5000" in text and "-2.2500" in text and "device='hpu:2'" in text


def test_state_dict_round_trip_across_devices(tmp_path):
    model = torch.nn.Linear(3, 2)
    on_hpu = torch.nn.Linear(3, 2).to("hpu:1")
    on_hpu.load_state_dict(model.state_dict())
    assert on_hpu.weight.device == torch.device("hpu:1")
    path = tmp_path / "hpu.pt"
    torch.save(on_hpu.state_dict(), path)
    as_saved = torch.load(path)
    assert as_saved["weight"].device == torch.device("hpu:1")
    on_cpu = torch.load(path, map_location="cpu")
    assert torch.equal(on_cpu["weight"], model.weight.detach())
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location="hpu:3")
    assert loaded["bias"].device == torch.device("hpu:3")
    assert torch.equal(loaded["bias"].cpu(), model.bias.detach())


def test_device_mixes_a_real_device_refuses_are_refused():
    x = torch.ones(3, device="hpu:0")
    with pytest.raises(RuntimeError, match="same device, but found at least two devices, hpu:0 and hpu:1"):
        x + torch.ones(3, device="hpu:1")
    with pytest.raises(RuntimeError, match="hpu:0 and cpu"):
        x * torch.ones(3)
    assert (x * torch.tensor(2.0)).tolist() == [2.0, 2.0, 2.0]  # 0-dim cpu tensors mix, as on other devices
    assert x[torch.tensor([0, 2])].tolist() == [1.0, 1.0]  # so do cpu indices
