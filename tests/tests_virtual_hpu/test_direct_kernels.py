"""The ops with direct (unboxed) HPU kernels behave as through the boxed fallback: CPU results, the caller's tensor
back from in-place ops, float64 rounded to float32, device mixes refused, every op counted, and the alias objects
they reuse per thread hold no device memory once the op is done."""

import threading

import habana_frameworks.torch.hpu as hthpu
import pytest
import torch

from virtual_hpu import accounting

# One call per op with a direct kernel (src/virtual_hpu/csrc/direct.cpp), on inputs that are not all contiguous.
CALLS = {
    "add": lambda a, b, w: a + b * 2,
    "add_scalar": lambda a, b, w: torch.add(a, 3.0, alpha=2),
    "sub": lambda a, b, w: a - b,
    "mul": lambda a, b, w: a * b,
    "div": lambda a, b, w: a / (b.abs() + 1),
    "neg_abs_exp": lambda a, b, w: a.neg().abs().exp(),
    "sqrt_rsqrt": lambda a, b, w: a.abs().add(1).sqrt().rsqrt(),
    "pow": lambda a, b, w: a.pow(2),
    "maximum_clamp": lambda a, b, w: torch.maximum(a, b).clamp(-0.5, 0.5),
    "where": lambda a, b, w: torch.where(a > 0, a, b),
    "mm_addmm_bmm": lambda a, b, w: torch.addmm(a[:, :3], a, w) + (a @ w) + torch.bmm(a[None], w[None])[0],
    "reductions": lambda a, b, w: a.sum(1) + a.mean(0, keepdim=True).sum(),
    "activations": lambda a, b, w: (
        torch.relu(a) + torch.nn.functional.gelu(a) + torch.nn.functional.silu(a) + a.tanh() + a.sigmoid()
    ),
    "softmax": lambda a, b, w: a.softmax(1) + a.log_softmax(0),
    "layer_norm": lambda a, b, w: torch.nn.functional.layer_norm(a, (a.shape[1],), w[0] + 1, w[1]),
    "nll_loss": lambda a, b, w: torch.nn.functional.cross_entropy(a, torch.tensor([0, 2, 1, 0], device=a.device)),
}


def _inputs(device: str) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(3, 4, generator=generator).t().to(device).requires_grad_()  # (4, 3), not contiguous
    b = torch.randn(4, 3, generator=generator).to(device).requires_grad_()
    w = torch.randn(3, 3, generator=generator).to(device).requires_grad_()
    return a, b, w


@pytest.mark.parametrize("name", sorted(CALLS))
def test_forward_and_backward_match_cpu(name):
    results = {}
    for device in ("cpu", "hpu"):
        inputs = _inputs(device)
        out = CALLS[name](*inputs)
        out.sum().backward()
        assert out.device.type == device
        results[device] = (out.detach().cpu(), *(t.grad.cpu() if t.grad is not None else None for t in inputs))
    for cpu, hpu in zip(results["cpu"], results["hpu"]):
        assert (cpu is None) == (hpu is None)
        if cpu is not None:
            torch.testing.assert_close(hpu, cpu, rtol=0, atol=0)


# Out-of-place elementwise ops whose CPU kernel writes its result straight into device memory: the result must have
# the CPU result's shape, strides and dtype whatever the inputs' layouts, promotion and broadcasting; but for add, sub,
# mul and div, whose results on hpu are contiguous, as torch's fake tensors take them to be (see below).
LAYOUTS = {
    "transposed": lambda g: (torch.randn(3, 4, generator=g).t(), torch.randn(4, 3, generator=g)),
    "both_transposed": lambda g: (torch.randn(3, 4, generator=g).t(), torch.randn(3, 4, generator=g).t()),
    "channels_last": lambda g: (
        torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last),
        torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last),
    ),
    "broadcast": lambda g: (torch.randn(3, 1, generator=g), torch.randn(1, 4, generator=g)),
    "int_and_float": lambda g: (torch.arange(6).view(2, 3), torch.randn(2, 3, generator=g)),
    "bf16_and_scalar_tensor": lambda g: (torch.randn(5, generator=g).bfloat16(), torch.tensor(2.5)),
    "strided_slice": lambda g: (torch.randn(6, 8, generator=g)[::2, 1::3], torch.randn(3, 3, generator=g)),
}
ELEMENTWISE = {
    "add": lambda a, b: torch.add(a, b, alpha=2),
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / (b.abs() + 1),
    "maximum": lambda a, b: torch.maximum(a.float(), b.float()),
    "unary": lambda a, b: a.float().neg().exp().sqrt().rsqrt().pow(3).tanh().sigmoid(),
    "activations": lambda a, b: torch.nn.functional.gelu(a.float()) + torch.nn.functional.silu(b.float()),
}
CONTIGUOUS = {"add", "sub", "mul", "div", "activations"}  # the last ends in an add


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_out_of_place_results_have_the_cpu_results_layout_and_dtype(name, layout):
    a, b = LAYOUTS[layout](torch.Generator().manual_seed(0))
    if layout == "bf16_and_scalar_tensor":
        on_hpu = (a.to("hpu"), b)  # a 0-dim CPU tensor meets HPU tensors, as a Python number does
    else:
        on_hpu = (a.to("hpu"), b.to("hpu"))
    # the same layouts on the CPU: a copy to another device makes a strided slice contiguous
    expected = ELEMENTWISE[name](*(t.cpu() for t in on_hpu))
    result = ELEMENTWISE[name](*on_hpu)
    assert result.device.type == "hpu"
    strides = expected.contiguous().stride() if name in CONTIGUOUS else expected.stride()
    assert (result.shape, result.stride(), result.dtype) == (expected.shape, strides, expected.dtype)
    torch.testing.assert_close(result.cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["transposed", "both_transposed", "channels_last", "strided_slice"])
@pytest.mark.parametrize("op", [torch.add, torch.sub, torch.mul, torch.div])
def test_binary_results_have_the_strides_torchs_fake_tensors_give_hpu(op, layout):
    """Compiled graphs plan their views on fake tensors' strides, and torch's fake tensors take hpu's results of these
    ops to be contiguous (``torch._subclasses.fake_impls``: hpu does not support non-contiguous outputs); a result of
    other strides made the views of a decomposition fail (SDPA's on torch 2.6, on permuted query, key and value)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    a, b = (t.to("hpu") for t in LAYOUTS[layout](torch.Generator().manual_seed(0)))
    with FakeTensorMode() as mode:
        fake = op(mode.from_tensor(a), mode.from_tensor(b))
    assert op(a, b).stride() == fake.stride()


# Matmuls, reductions and softmaxes, whose CPU kernel also writes a dense result straight into device memory; each on a
# (2, 128, 128) float32 tensor, with a result of 64 KiB or more.
DENSE = {
    "mm": lambda x: x[0] @ x[1],
    "addmm": lambda x: torch.addmm(x[0], x[1], x[0], beta=0.5),
    "bmm": lambda x: torch.bmm(x, x),
    "baddbmm": lambda x: torch.baddbmm(x, x, x, alpha=2),
    "sum": lambda x: x.sum(0),
    "mean": lambda x: x.mean(0, keepdim=True),
    "softmax": lambda x: x.softmax(2),
    "log_softmax": lambda x: x.log_softmax(1),
}


@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
@pytest.mark.parametrize("name", sorted(DENSE))
def test_dense_results_have_the_cpu_results_layout_and_values(name, transposed):
    x = torch.randn(2, 128, 128, generator=torch.Generator().manual_seed(0))
    x = x.transpose(1, 2) if transposed else x
    expected, result = DENSE[name](x), DENSE[name](x.to("hpu"))
    assert result.device.type == "hpu"
    assert (result.shape, result.stride(), result.dtype) == (expected.shape, expected.stride(), expected.dtype)
    torch.testing.assert_close(result.cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(DENSE))
def test_dense_results_come_from_the_device_pool(name):
    x = torch.randn(2, 128, 128, device="hpu")
    DENSE[name](x)  # from now on a freed block of the result's size waits in the pool
    before = hthpu.memory_stats()
    for _ in range(3):
        result = DENSE[name](x)
        assert result.untyped_storage().nbytes() >= 64 * 2**10
        del result
    after = hthpu.memory_stats()
    # a CPU result adopted as device memory would be a new block from the host at every call
    assert after["TotalSystemAllocs"] == before["TotalSystemAllocs"]
    assert after["NumAllocs"] >= before["NumAllocs"] + 3


def test_an_out_of_place_result_is_device_memory_of_its_own():
    a, b = torch.ones(256, device="hpu"), torch.full((256,), 2.0, device="hpu")
    hthpu.synchronize()
    before = hthpu.memory_allocated()
    product = a * b
    assert hthpu.memory_allocated() - before == product.untyped_storage().nbytes() == 256 * 4
    assert product.untyped_storage().data_ptr() not in (a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr())
    product.add_(1)  # its own memory: the inputs do not change
    assert torch.equal(a.cpu(), torch.ones(256)) and torch.equal(product.cpu(), torch.full((256,), 3.0))
    del product
    assert hthpu.memory_allocated() == before


def test_in_place_ops_write_the_callers_tensor_and_bump_its_version():
    a = torch.zeros(5, device="hpu")
    version = a._version
    storage = a.untyped_storage().data_ptr()
    returned = a.add_(torch.ones(5, device="hpu")).mul_(3).addcmul_(a, a, value=0.5).lerp_(a, 0.25).div_(2)
    assert returned is a
    assert a._version == version + 5
    assert a.untyped_storage().data_ptr() == storage
    expected = torch.zeros(5).add_(torch.ones(5)).mul_(3)
    expected = expected.addcmul_(expected, expected, value=0.5).lerp_(expected, 0.25).div_(2)
    torch.testing.assert_close(a.cpu(), expected, rtol=0, atol=0)
    a.zero_()
    a.fill_(2.0)
    assert torch.equal(a.cpu(), torch.full((5,), 2.0))


def test_in_place_through_a_view_reaches_the_base():
    base = torch.zeros(4, 4, device="hpu")
    base[1:3, ::2].add_(1).mul_(5)
    expected = torch.zeros(4, 4)
    expected[1:3, ::2].add_(1).mul_(5)
    assert torch.equal(base.cpu(), expected)


def test_float64_results_have_float32_values():
    x = torch.tensor([1 / 3, 1 + 1e-10], dtype=torch.float64)
    rounded = x.float().double()
    on_hpu = x.to("hpu")
    assert torch.equal((on_hpu * 3).cpu(), (rounded * 3).float().double())
    on_hpu.mul_(1 / 3)
    assert torch.equal(on_hpu.cpu(), (rounded * (1 / 3)).float().double())


def test_a_cpu_tensor_with_dimensions_is_refused_and_a_cpu_scalar_is_taken():
    a = torch.ones(3, device="hpu")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*hpu:0 and cpu"):
        a.add_(torch.ones(3))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*hpu:0 and hpu:1"):
        torch.mm(torch.ones(2, 2, device="hpu:0"), torch.ones(2, 2, device="hpu:1"))
    assert torch.equal(a.mul_(torch.tensor(2.0)).cpu(), torch.full((3,), 2.0))


def test_results_stay_on_the_inputs_device():
    with torch.device("hpu:0"):
        a = torch.ones(2, 2, device="hpu:3")
        assert (a @ a).device == torch.device("hpu:3")
        assert (a * 2).device == torch.device("hpu:3")


def test_each_op_is_counted():
    a = torch.ones(8, device="hpu")
    before = accounting.counters()["ops"]
    for _ in range(10):
        a.add_(1.0).mul_(0.5)
    assert accounting.counters()["ops"] - before == 20


def test_device_memory_is_freed_when_the_last_tensor_goes():
    """The per-thread pool of alias objects must not keep the memory of the op's tensors alive."""
    hthpu.synchronize()
    baseline = hthpu.memory_allocated()

    def work() -> None:
        a = torch.randn(1024, 256, device="hpu")
        b = a * 2
        b.add_(a).relu_()
        assert hthpu.memory_allocated() >= baseline + 2 * a.nbytes
        del a, b

    work()
    assert hthpu.memory_allocated() == baseline
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert hthpu.memory_allocated() == baseline


def test_a_cpu_result_that_views_an_input_is_a_view_of_the_hpu_tensor():
    """An op whose CPU kernel returns its input aliases must give back the HPU tensor's memory, not a copy."""
    a = torch.zeros(6, device="hpu")
    same = a.contiguous()  # returns self
    assert same.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    same.add_(1)
    assert torch.equal(a.cpu(), torch.ones(6))


def test_low_precision_matmuls_are_one_rounding_of_fp32_where_widened(python):
    """Where the host CPU has no bf16/fp16 matrix instructions, torch's own low-precision matmul is about a hundred
    times slower than fp32; the virtual Gaudi then computes those in fp32 and rounds once, as Gaudi's matrix engine
    accumulates. Turned on here for both dtypes, whatever this host has (a fresh process: the setting is global)."""
    result = python(
        """
        import torch
        torch.ops.virtual_hpu.widen_low_precision_matmuls(True, True)
        torch.manual_seed(0)
        a, b, c = torch.randn(48, 256), torch.randn(256, 24), torch.randn(48, 24)
        for dtype in (torch.bfloat16, torch.float16):
            x, y, z = (t.to(dtype) for t in (a, b, c))
            X, Y, Z = (t.to("hpu") for t in (x, y, z))
            wide = lambda t: t.float()
            checks = {
                "mm": (X @ Y, (wide(x) @ wide(y)).to(dtype)),
                "addmm": (torch.addmm(Z, X, Y, beta=0.5), torch.addmm(wide(z), wide(x), wide(y), beta=0.5).to(dtype)),
                "bmm": (torch.bmm(X[None], Y[None]), torch.bmm(wide(x)[None], wide(y)[None]).to(dtype)),
                "baddbmm": (
                    torch.baddbmm(Z[None], X[None], Y[None]),
                    torch.baddbmm(wide(z)[None], wide(x)[None], wide(y)[None]).to(dtype),
                ),
            }
            with torch.autocast("hpu", dtype=dtype):
                linear = torch.nn.functional.linear(a.to("hpu"), b.t().to("hpu"))
            checks["autocast linear"] = (linear, (wide(x) @ wide(y)).to(dtype))
            for name, (hpu, expected) in checks.items():
                assert hpu.dtype == dtype, (name, hpu.dtype)
                assert torch.equal(hpu.cpu(), expected), (name, dtype)
            # mixed dtypes are still refused, as the CPU kernel refuses them
            try:
                torch.mm(X, Y.float())
            except RuntimeError:
                pass
            else:
                raise AssertionError("a mixed-dtype mm was accepted")
        print("ok")
        """,
        VIRTUAL_HPU="1",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matmuls_are_widened_exactly_where_the_host_lacks_the_units(dtype):
    """Activation asks oneDNN: without the dtype's matrix instructions the product is one rounding of fp32's, with
    them it is the CPU kernel's own (K large enough that the two differ for float16)."""
    torch.manual_seed(0)
    x, y = torch.randn(48, 1000).to(dtype), torch.randn(1000, 24).to(dtype)
    supported = {
        torch.bfloat16: torch.ops.mkldnn._is_mkldnn_bf16_supported,
        torch.float16: torch.ops.mkldnn._is_mkldnn_fp16_supported,
    }
    expected = x @ y if supported[dtype]() else (x.float() @ y.float()).to(dtype)
    assert torch.equal((x.to("hpu") @ y.to("hpu")).cpu(), expected)
