"""The levers of the docs' performance page (``hpu_performance.rst``) move their counts the way the page says, as
``examples/pytorch/hpu_performance_levers.py`` prints them; and the host syncs the examples count at PyTorch's
dispatcher are those the virtual Gaudi counts at the device."""

import functools
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# imported with the module, as the example imports it: Lightning sets environment variables when it is first imported,
# which a test must not do (`leave_the_process_as_found`)
import pytorch_lightning  # noqa: F401
from tests_pytorch.helpers.runif import RunIf
from virtual_hpu import torch_support

EXAMPLES = Path(__file__).parents[2] / "examples" / "pytorch"


def _levers() -> dict:
    """Each lever's line of the example's output, by lever."""
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "hpu_performance_levers.py"), "--lever", "all"],
        env={**os.environ, "MASTER_ADDR": "127.0.0.1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = {}
    for line in result.stdout.splitlines():
        lever, _, rest = line.partition(": ")
        if lever in ("compile", "optimizer", "host-syncs"):
            lines[lever] = rest
    assert sorted(lines) == ["compile", "host-syncs", "optimizer"], result.stdout[-3000:]
    return lines


def _numbers(pattern: str, line: str) -> list:
    found = re.search(pattern, line)
    assert found, f"{pattern!r} not in {line!r}"
    return [float(number) for number in found.groups()]


# about 25 s on two cores: four fits compile, and one process imports transformers
@pytest.mark.heavy
def test_each_lever_moves_its_count():
    lines = _levers()
    # the whole model: dynamo traces every layer; each layer compiled: one layer's ops, in one graph all layers run
    whole, layers, layers_graphs = _numbers(
        r"ops traced by dynamo (\d+) -> (\d+) \(\d+ layers; graphs traced \d+ -> (\d+)\)", lines["compile"]
    )
    assert whole > 3 * layers > 0
    assert layers_graphs == 1
    # Gaudi's FusedAdamW updates a parameter group in one op (with its step size and weight decay as device tensors),
    # torch's loop each parameter in several
    loop, hpex = _numbers(r"torch.optim.AdamW (\d+), .* hpex FusedAdamW (\d+)", lines["optimizer"])
    assert 0 < hpex < loop / 4
    if torch_support.installed() >= torch_support.TorchRelease(2, 7):  # fused=True takes hpu tensors (pytorch#148666)
        (fused,) = _numbers(r"AdamW\(fused=True\) (\d+)", lines["optimizer"])
        assert fused < loop / 4
    # reading the loss each step: the step's own .item() and Lightning's read of the value shown on the progress bar
    every_step, per_epoch = _numbers(r"host syncs per step ([\d.]+) -> ([\d.]+)", lines["host-syncs"])
    assert every_step == 2
    assert per_epoch == 0
    assert "aten._local_scalar_dense" in lines["host-syncs"]


@functools.cache
def _counter_type():
    spec = importlib.util.spec_from_file_location("hpu_llama_throughput", EXAMPLES / "hpu_llama_throughput.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.DeviceOpCounter


@RunIf(virtual_hpu=True)
@pytest.mark.parametrize(
    ("read", "syncs"),
    [
        (lambda x: x.sum().item(), 1),
        (lambda x: bool(x.sum() > 0), 1),
        (lambda x: x.cpu(), 1),
        (lambda x: x.tolist(), 1),
        (lambda x: torch.empty(x.shape).copy_(x), 1),
        (lambda x: torch.allclose(x, x), 1),
        (lambda x: x.sum(), 0),
    ],
    ids=["item", "bool", "cpu", "tolist", "copy_", "allclose", "nothing"],
)
def test_the_dispatchers_count_is_the_devices(read, syncs, fresh_compilation_state):
    """What the examples count at the dispatcher is what the virtual Gaudi counts at the device, for each way a step
    reads a value, after compiled code (which reads nothing)."""
    from virtual_hpu import accounting

    compiled = torch.compile(lambda x: (x * 2).sin(), backend="hpu_backend")
    x = torch.randn(4, 4, device="hpu")
    compiled(x)  # compiles, outside the count
    accounting.reset()
    with _counter_type()() as counter:
        read(compiled(x))
    assert accounting.counters()["host_syncs"] == syncs
    assert sum(counter.host_syncs.values()) == syncs
