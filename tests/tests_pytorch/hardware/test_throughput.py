"""The throughput tier: a small Llama trained in bf16 with each decoder layer compiled by ``hpu_backend``, on one card
and on the node's cards (``--hpus N``), through ``examples/pytorch/hpu_llama_throughput.py``.

It prints tokens per second, MFU and peak HPU memory (``pytest -m hpu -s``; also in the test's recorded properties,
``--junitxml``), and checks what makes steady steps slow on Gaudi: a graph compiled again (the bridge's
``graph_compilation`` metric) or a host sync (counted at PyTorch's dispatcher, as the bridge has no counter of them).
In the rehearsal (``VIRTUAL_HPU_AS_HARDWARE=1``) the model is tiny and the figures say nothing of a Gaudi's speed;
on a Gaudi it has about 125 M parameters and sequences of 1,024 tokens. The performance page of the docs
(``hpu_performance.rst``) explains the figures.
"""

import functools
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

# imported with the module, as the example imports it: Lightning sets environment variables when it is first imported,
# which a test must not do (`leave_the_process_as_found`)
import pytorch_lightning  # noqa: F401
from tests_pytorch.helpers.processes import run_ddp
from tests_pytorch.helpers.runif import RunIf, _rehearsal

EXAMPLE = Path(__file__).parents[3] / "examples" / "pytorch" / "hpu_llama_throughput.py"
# minutes on a Gaudi, tens of seconds in the rehearsal (make test-heavy runs them, in CI too); `-m hpu` selects them
pytestmark = pytest.mark.heavy


def _size() -> list:
    """A model whose figures mean something on a Gaudi; a tiny one on the host, so that the rehearsal takes seconds."""
    return ["--size", "tiny", "--timed-steps", "4"] if _rehearsal() else ["--size", "small"]


def _train(out: Path, devices: int, *args: str) -> list:
    """Each rank's figures from a run of the example on ``devices`` cards (Lightning starts the other ranks)."""
    process = run_ddp(out, "--devices", str(devices), *_size(), *args, script=EXAMPLE)
    # a Gaudi compiles the 125 M-parameter model's layers and steps for minutes on 8 cards: more than `wait` allows
    output, _ = process.communicate(timeout=240 if _rehearsal() else 1200)
    assert process.returncode == 0, output[-5000:]
    ranks = [json.loads(path.read_text()) for path in sorted(out.glob("rank*.json"))]
    assert [rank["rank"] for rank in ranks] == list(range(devices)), output[-3000:]
    return ranks


def _report(name: str, figures: dict, record_property) -> None:
    for key in ("tokens_per_sec", "tokens_per_sec_per_device", "mfu", "peak_memory", "warmup_seconds"):
        record_property(f"{name}_{key}", figures[key])
    mfu = "none" if figures["mfu"] is None else f"{figures['mfu']:.3%}"
    print(
        f"\n{name}: {figures['world_size']} x {figures['device']}, {figures['parameters'] / 1e6:.1f} M parameters:"
        f" {figures['tokens_per_sec']:,.0f} tokens/s ({figures['tokens_per_sec_per_device']:,.0f} per card),"
        f" MFU {mfu}, peak HPU memory {figures['peak_memory'] / 2**30:.3f} GiB,"
        f" warm-up {figures['warmup_seconds']:.1f} s"
    )


def _assert_steady(figures: dict) -> None:
    rank = f"rank {figures['rank']} of {figures['world_size']}"
    assert figures["compilations_in_steady_steps"] == 0, f"{rank} compiled graphs after warm-up"
    assert figures["host_syncs"] == {}, f"{rank} waited for the device in steps {figures['counted_steps']}"
    assert figures["tokens_per_sec_per_device"] > 0
    # the FLOPs of the timed steps at the published peak of the generation present: a fraction of one
    assert figures["peak_flops"] is not None
    assert 0 < figures["mfu"] < 1
    assert 0 < figures["peak_memory"] < figures["memory_limit"]


@RunIf(hpu=True)
def test_llama_throughput_on_one_card_and_on_the_node(tmp_path, hpus, record_property):
    """Tokens/s, MFU and memory on 1 and on N cards; after warm-up no step compiles a graph or waits for the host."""
    (one,) = _train(tmp_path / "one", 1)
    ranks = _train(tmp_path / "node", hpus)
    _report("1 card", one, record_property)
    _report(f"{hpus} cards", ranks[0], record_property)
    print(f"scaling: {ranks[0]['tokens_per_sec'] / (hpus * one['tokens_per_sec']):.0%} of {hpus} x one card's tokens/s")
    for figures in [one, *ranks]:
        _assert_steady(figures)
    assert {figures["world_size"] for figures in ranks} == {hpus}
    # every rank trains the same model on batches of the same size
    assert {figures["parameters"] for figures in [one, *ranks]} == {one["parameters"]}


@functools.cache
def _example():
    spec = importlib.util.spec_from_file_location("hpu_llama_throughput", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compilations() -> int:
    from habana_frameworks.torch.hpu.metrics import metric_global

    return dict(metric_global("graph_compilation").stats())["TotalNumber"]


@RunIf(hpu=True)
def test_the_host_sync_count_sees_a_step_that_reads_the_loss(fresh_compilation_state):
    """The count the tier relies on is not blind: a compiled step that reads its loss on the host (``.item()``) or
    copies it there (``.cpu()``) is caught, one that does not is clean, and compiled code keeps running compiled."""
    counter_type = _example().DeviceOpCounter
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 1)).to("hpu")
    compiled = torch.compile(model, backend="hpu_backend")
    data = torch.randn(8, 16, device="hpu")

    def step(read: str) -> None:
        loss = compiled(data).square().mean()
        loss.backward()
        if read == "item":
            loss.item()
        elif read == "cpu":
            loss.detach().cpu()

    step("")  # compiles
    before = _compilations()
    found = {}
    for read in ("", "item", "cpu"):
        with counter_type() as counter:
            for _ in range(3):
                step(read)
        found[read] = dict(counter.host_syncs)
        assert counter.ops > 0
    assert found == {"": {}, "item": {"aten._local_scalar_dense": 3}, "cpu": {"aten._to_copy": 3}}
    # counting compiled nothing again
    assert _compilations() == before


@RunIf(hpu=True)
@pytest.mark.skipif(
    not hasattr(TorchDispatchMode, "ignore_compile_internals"),
    reason="dynamo compiles under a dispatch mode that ignores its internals from torch 2.9; before, the count is"
    " taken over steps that compile nothing",
)
def test_the_host_sync_count_leaves_torch_compile_compiling(fresh_compilation_state):
    """Under the count, ``torch.compile`` still compiles a new shape, and the function stays compiled after it (a
    dispatch mode dynamo does not know makes it run the function eagerly, then and afterwards)."""
    counter_type = _example().DeviceOpCounter
    function = torch.compile(lambda x: (x.sin() * 2).cos(), backend="hpu_backend", dynamic=False)
    with counter_type():
        function(torch.randn(4, device="hpu"))
    compiled = _compilations()
    assert compiled > 0
    function(torch.randn(4, device="hpu"))
    function(torch.randn(5, device="hpu"))
    assert _compilations() > compiled
