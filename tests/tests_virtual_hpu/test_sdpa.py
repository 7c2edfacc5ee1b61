"""``scaled_dot_product_attention`` trains on hpu as on CPU for every argument combination models use."""

import pytest
import torch
import torch.nn.functional as F

from tests_virtual_hpu.sdpa_reference import backends_as_on_hpu

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# name -> keyword arguments of scaled_dot_product_attention; "bias" is a float mask that requires grad (T5's
# relative position bias), "gqa" has fewer key/value heads than query heads.
VARIANTS = ("plain", "bool_mask", "float_mask", "bias", "causal", "dropout", "dropout_bias", "gqa", "gqa_causal")


def _inputs(variant: str, dtype: torch.dtype, device: str) -> tuple[list[torch.Tensor], dict]:
    generator = torch.Generator().manual_seed(0)
    kv_heads = 2 if variant.startswith("gqa") else 4

    def rand(*shape, grad=True):
        t = torch.randn(*shape, generator=generator).to(dtype).to(device)
        return t.requires_grad_(grad)

    q, k, v = rand(2, 4, 5, 8), rand(2, kv_heads, 6, 8), rand(2, kv_heads, 6, 8)
    kwargs = {}
    if variant == "bool_mask":
        kwargs["attn_mask"] = (torch.rand(2, 1, 5, 6, generator=generator) > 0.3).to(device)
    elif variant == "float_mask":
        kwargs["attn_mask"] = rand(1, 4, 5, 6, grad=False)
    elif variant in ("bias", "dropout_bias"):
        kwargs["attn_mask"] = rand(1, 4, 5, 6)
    if variant.endswith("causal"):
        kwargs["is_causal"] = True
    if variant.startswith("dropout"):
        kwargs["dropout_p"] = 0.3
    if variant.startswith("gqa"):
        kwargs["enable_gqa"] = True
    tensors = [q, k, v] + [t for t in kwargs.values() if isinstance(t, torch.Tensor) and t.requires_grad]
    return tensors, kwargs


def _train_step(variant: str, dtype: torch.dtype, device: str, autocast: bool):
    tensors, kwargs = _inputs(variant, dtype, device)
    torch.manual_seed(1)  # the dropout mask: hpu draws from the same generator as CPU
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast), backends_as_on_hpu(torch.device(device)):
        out = F.scaled_dot_product_attention(*tensors[:3], **kwargs)
    weights = torch.linspace(-1, 1, out.numel()).view(out.shape).to(device)
    (out.float() * weights).sum().backward()
    return out.detach().cpu(), [t.grad.cpu() for t in tensors]


# Inputs in each dtype, and fp32 inputs under bf16 autocast (which casts query, key, value and a float mask).
@pytest.mark.parametrize(("dtype", "autocast"), [(d, False) for d in DTYPES] + [("fp32", True)])
@pytest.mark.parametrize("variant", VARIANTS)
def test_sdpa_trains_as_on_cpu(variant, dtype, autocast):
    expected, expected_grads = _train_step(variant, DTYPES[dtype], "cpu", autocast)
    actual, actual_grads = _train_step(variant, DTYPES[dtype], "hpu", autocast)
    where = f"sdpa {variant} in {dtype}{' under bf16 autocast' if autocast else ''}"
    assert actual.dtype == expected.dtype, f"{where}: output {actual.dtype}, CPU gives {expected.dtype}"
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, msg=lambda m: f"{where}, forward: {m}")
    names = ["query", "key", "value", "attn_mask"]
    for name, grad, reference in zip(names, actual_grads, expected_grads):
        assert grad.dtype == reference.dtype, f"{where}: grad of {name} is {grad.dtype}, CPU gives {reference.dtype}"
        torch.testing.assert_close(grad, reference, rtol=0, atol=0, msg=lambda m, n=name: f"{where}, grad {n}: {m}")


def test_dropout_drops_and_scales():
    """The seeded comparison above would also pass with no dropout at all: check that some weights are dropped."""
    q = torch.ones(1, 1, 64, 8, device="hpu")
    v = torch.ones(1, 1, 64, 8, device="hpu", requires_grad=True)
    out = F.scaled_dot_product_attention(q, q, v, dropout_p=0.5)
    # uniform weights 1/64 over ones: each output is (kept weights / 64) / (1 - p), around 1 but not all equal to it
    assert out.std().item() > 0.05
    assert abs(out.mean().item() - 1.0) < 0.2
    out.sum().backward()
    assert v.grad.abs().sum().item() > 0
