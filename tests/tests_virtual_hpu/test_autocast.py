"""torch.autocast("hpu") follows the op lists, matches cpu autocast for the same ops, and supports backward."""

import pytest
import torch
from torch import nn

from virtual_hpu import autocast


@pytest.fixture(autouse=True)
def _default_lists():
    """Each test starts from Gaudi's default lists; whatever was installed before is put back afterwards."""
    lower, fp32 = autocast.op_lists()
    autocast.set_op_lists(autocast.DEFAULT_LOWER, autocast.DEFAULT_FP32)
    yield
    autocast.set_op_lists(lower, fp32)


def test_default_lists_are_gaudis():
    lower, fp32 = autocast.op_lists()
    assert {"linear", "matmul", "conv2d", "bmm", "softmax"} <= set(lower)
    assert {"cross_entropy_loss", "nll_loss", "exp", "log", "div"} <= set(fp32)


def test_linear_matches_cpu_autocast_including_backward():
    torch.manual_seed(0)
    cpu_layer = nn.Linear(8, 4)
    hpu_layer = nn.Linear(8, 4).to("hpu")
    hpu_layer.load_state_dict(cpu_layer.state_dict())
    x = torch.randn(3, 8, requires_grad=True)
    hx = x.detach().to("hpu").requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = cpu_layer(x)
    with torch.autocast("hpu", dtype=torch.bfloat16):
        actual = hpu_layer(hx)
    assert actual.dtype == torch.bfloat16
    assert torch.equal(actual.cpu(), expected)
    expected.float().square().sum().backward()
    actual.float().square().sum().backward()
    assert hpu_layer.weight.grad.dtype == torch.float32
    assert torch.equal(hx.grad.cpu(), x.grad)
    assert torch.equal(hpu_layer.weight.grad.cpu(), cpu_layer.weight.grad)


def test_fp32_list_and_unlisted_ops():
    x = torch.randn(4, 5, device="hpu").bfloat16()
    with torch.autocast("hpu", dtype=torch.bfloat16):
        assert torch.exp(x).dtype == torch.float32  # fp32 list
        assert torch.relu(x).dtype == torch.bfloat16  # unlisted: runs in its input's dtype
        assert torch.relu(x.float()).dtype == torch.float32
    assert torch.exp(x).dtype == torch.bfloat16  # outside autocast nothing is cast


def test_set_op_lists_moves_ops_and_rejects_unknown_names():
    x = torch.randn(4, 5, device="hpu")
    autocast.set_op_lists(lower=["relu"], fp32=["mm"])
    with torch.autocast("hpu", dtype=torch.bfloat16):
        assert torch.relu(x).dtype == torch.bfloat16
        assert (x.bfloat16() @ x.t().bfloat16()).dtype == torch.float32
        assert nn.functional.linear(x, x).dtype == torch.float32  # no longer listed
    with pytest.raises(ValueError, match="not_an_op"):
        autocast.set_op_lists(lower=["not_an_op"])
    assert autocast.op_lists() == (("relu",), ("mm",))


def test_fp16_autocast_and_batch_norm_statistics():
    bn = nn.BatchNorm1d(4).to("hpu")
    x = torch.randn(6, 4, device="hpu") + 3
    with torch.autocast("hpu", dtype=torch.float16):
        out = nn.functional.linear(x, torch.eye(4, device="hpu"))
        normed = bn(out)
    assert out.dtype == torch.float16 and normed.dtype == torch.float16
    assert bn.running_mean.dtype == torch.float32
    assert bn.running_mean.min().item() > 0.1  # the statistics were updated in place


def test_env_lists_are_read_at_activation_only(tmp_path, python):
    """As Intel's bridge (1.19 and newer): PT_HPU_AUTOCAST_* are read once, when the device is activated; the older
    LOWER_LIST/FP32_LIST names are not read, and ``hpu_set_env`` (the inference-mode switch) reads nothing."""
    lower, fp32, later = tmp_path / "lower.txt", tmp_path / "fp32.txt", tmp_path / "later.txt"
    lower.write_text("relu\n\nmm\n")
    fp32.write_text("linear\n")
    later.write_text("linear\n")
    result = python(
        """
        import os, torch, virtual_hpu
        virtual_hpu.activate()
        import habana_frameworks.torch.core as htcore

        def dtypes():
            x = torch.randn(3, 3, device="hpu")
            with torch.autocast("hpu", dtype=torch.bfloat16):
                print(torch.relu(x).dtype, (x @ x).dtype, torch.nn.functional.linear(x.bfloat16(), x.bfloat16()).dtype)

        dtypes()
        os.environ["PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"] = os.environ["LATER"]
        os.environ["LOWER_LIST"] = os.environ["LATER"]
        htcore.hpu_set_env()
        dtypes()
        """,
        PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST=str(lower),
        PT_HPU_AUTOCAST_FP32_OPS_LIST=str(fp32),
        LATER=str(later),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["torch.bfloat16", "torch.bfloat16", "torch.float32"] * 2


def test_the_older_variable_names_are_not_read(tmp_path, python):
    fp32 = tmp_path / "fp32.txt"
    fp32.write_text("linear\n")
    result = python(
        """
        import torch, virtual_hpu
        virtual_hpu.activate()
        x = torch.randn(3, 3, device="hpu")
        with torch.autocast("hpu", dtype=torch.bfloat16):
            print(torch.nn.functional.linear(x, x).dtype)
        """,
        FP32_LIST=str(fp32),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["torch.bfloat16"]


def test_fp16_is_refused_on_first_generation_gaudi(python):
    result = python(
        """
        import torch, virtual_hpu
        virtual_hpu.activate(generation="GAUDI")
        import habana_frameworks.torch.utils.experimental as htexp
        print(htexp._is_fp16_supported())
        x = torch.randn(2, 2, device="hpu")
        with torch.autocast("hpu", dtype=torch.bfloat16):
            print((x @ x).dtype)
        with torch.autocast("hpu", dtype=torch.float16):
            x @ x
        """
    )
    assert result.stdout.split() == ["False", "torch.bfloat16"]
    assert "float16 autocast is not supported on first-generation Gaudi" in result.stderr


def test_gaudi_and_hmp_op_names_map_to_the_aten_ops_autocast_sees():
    autocast.set_op_lists(lower=["linear"], fp32=["cross_entropy", "truediv", "log_softmax", "nll_loss"])
    try:
        assert autocast.op_lists() == (("linear",), ("cross_entropy_loss", "div", "log_softmax", "nll_loss"))
        logits = torch.randn(4, 5, device="hpu").bfloat16()
        with torch.autocast("hpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2, 3], device="hpu"))
            ratio = logits / 2
        assert loss.dtype == torch.float32 and ratio.dtype == torch.float32
    finally:
        autocast.set_op_lists_from_env()


def test_a_typo_in_an_op_list_names_the_closest_ops():
    with pytest.raises(ValueError, match=r"'lienar' \(did you mean 'linear'"):
        autocast.set_op_lists(lower=["lienar"])


@pytest.mark.parametrize(("content", "ok"), [("cross_entropy\ntruediv\n", True), ("cross_entropi\n", False)])
def test_fp32_list_with_hmp_names_is_read_at_activation(python, tmp_path, content, ok):
    fp32 = tmp_path / "fp32.txt"
    fp32.write_text(content)
    result = python(
        "import torch; print(torch.hpu.is_available())", VIRTUAL_HPU="1", PT_HPU_AUTOCAST_FP32_OPS_LIST=str(fp32)
    )
    if ok:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0
        assert "did you mean 'cross_entropy'" in result.stderr and "PT_HPU_AUTOCAST_FP32_OPS_LIST=" in result.stderr
