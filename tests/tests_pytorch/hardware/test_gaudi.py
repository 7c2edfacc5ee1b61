"""The hardware tier: what only a real Gaudi can show, selected with ``pytest -m hpu`` (``--hpus N`` limits the cards).

Each test uses only what Intel's bridge exposes (``torch.hpu``, ``habana_frameworks.torch``), so the rehearsal
(``VIRTUAL_HPU_AS_HARDWARE=1``) runs them on the virtual Gaudi too, except those marked ``physical``, which measure
what only silicon has. Counts of graph compilations come from the bridge's metrics, as a Gaudi user reads them.
"""

import time

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel
from torch import nn

import pytorch_lightning as pl
from tests_pytorch.helpers.processes import assert_same_parameters, rank_results, run_ddp, wait
from tests_pytorch.helpers.runif import RunIf

QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}


def _compilations() -> int:
    from habana_frameworks.torch.hpu.metrics import metric_global

    return dict(metric_global("graph_compilation").stats())["TotalNumber"]


class _CompilationsPerStep(Callback):
    """The bridge's count of graph compilations after each training step."""

    def __init__(self) -> None:
        self.counts: list[int] = []

    def on_train_batch_end(self, *args, **kwargs) -> None:
        self.counts.append(_compilations())


@pytest.mark.heavy  # 40 s in the rehearsal, for room under make test's 20 minutes; `pytest -m hpu` still selects it
@RunIf(hpu=True)
def test_data_parallel_over_the_node_ends_as_one_card(tmp_path, hpus):
    """HCCL across the node's cards: N ranks on slices of each global batch end where one card on whole batches does,
    and every rank holds the same parameters."""
    if hpus < 2:
        pytest.skip(f"needs 2 or more HPUs; --hpus gave {hpus}")
    one, many = tmp_path / "one", tmp_path / "many"
    one.mkdir(), many.mkdir()
    wait(run_ddp(one, "--devices", "1"))
    wait(run_ddp(many, "--devices", str(hpus), "--strategy", "hpu_parallel"))
    (single,) = rank_results(one)
    ranks = rank_results(many)
    assert [rank["world_size"] for rank in ranks] == [hpus] * hpus
    for rank in ranks[1:]:
        assert_same_parameters(ranks[0]["state"], rank["state"])
    # the reduction order of HCCL differs from one card's sum
    assert_same_parameters(single["state"], ranks[0]["state"], tolerance=1e-5)


@RunIf(hpu=True)
def test_device_memory_is_counted_against_the_limit():
    """``torch.hpu.memory_stats`` follows allocations on the device, below its ``Limit``; a request over it fails."""
    torch.hpu.synchronize()
    before = torch.hpu.memory_stats()
    block = torch.empty(64 * 2**20, dtype=torch.uint8, device="hpu")
    block.fill_(1)
    torch.hpu.synchronize()
    during = torch.hpu.memory_stats()
    assert during["InUse"] - before["InUse"] >= 64 * 2**20
    assert during["MaxInUse"] >= during["InUse"]
    assert 0 < during["InUse"] < during["Limit"]
    assert torch.hpu.max_memory_allocated() >= during["InUse"]
    del block
    torch.hpu.synchronize()
    assert torch.hpu.memory_stats()["InUse"] < during["InUse"]
    with pytest.raises(RuntimeError):
        torch.empty(during["Limit"] + 2**30, dtype=torch.uint8, device="hpu").fill_(0)
        torch.hpu.synchronize()


@RunIf(hpu=True)
@pytest.mark.parametrize("hpu_mode", ["lazy"])
def test_lazy_mode_compiles_a_steps_graphs_once(hpu_mode):
    """In lazy mode every training step has the same graphs: after the first steps, nothing is compiled again."""
    counter = _CompilationsPerStep()
    trainer = pl.Trainer(accelerator="hpu", devices=1, max_steps=8, callbacks=[counter], **QUIET)
    trainer.fit(BoringModel())
    assert counter.counts[0] > 0
    assert counter.counts[-1] == counter.counts[2], counter.counts


@RunIf(hpu=True)
def test_compiled_module_is_compiled_once(fresh_compilation_state):
    """Eager mode with ``torch.compile(backend="hpu_backend")``: one compilation for a fixed shape, none per step."""
    counter = _CompilationsPerStep()
    trainer = pl.Trainer(accelerator="hpu", devices=1, max_steps=6, callbacks=[counter], **QUIET)
    trainer.fit(torch.compile(BoringModel(), backend="hpu_backend"))
    assert counter.counts[0] > 0
    assert counter.counts[-1] == counter.counts[1], counter.counts


@RunIf(hpu=True)
def test_fp8_training_follows_the_fp32_run(tmp_path):
    """fp8 (Gaudi2 and newer) trains the same model to about the loss of the fp32 run."""
    import habana_frameworks.torch.hpu as hthpu

    if hthpu.get_device_name() == "GAUDI":
        pytest.skip("first-generation Gaudi has no fp8")
    full, fp8 = tmp_path / "fp32", tmp_path / "fp8"
    full.mkdir(), fp8.mkdir()
    wait(run_ddp(full, "--devices", "1", "--max-epochs", "4"))
    wait(run_ddp(fp8, "--devices", "1", "--max-epochs", "4", "--fp8", "local"))
    (reference,), (result,) = rank_results(full), rank_results(fp8)
    assert result["loss"] == pytest.approx(reference["loss"], rel=0.1)
    assert result["fp8"], "no layer trained in fp8"


def _median_seconds(step, repeats: int = 20) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        torch.hpu.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


@RunIf(hpu=True, physical="HPU graphs save host time only on a Gaudi")
@pytest.mark.parametrize("hpu_mode", ["lazy"])
def test_hpu_graph_replay_is_faster_than_launching_each_op(hpu_mode):
    """A module of many small ops replayed as an HPU graph runs faster than the same module launched op by op."""
    import habana_frameworks.torch as ht

    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(48)]).to("hpu").eval()
    graphed = ht.hpu.wrap_in_hpu_graph(nn.Sequential(*[nn.Linear(64, 64) for _ in range(48)]).to("hpu").eval())
    graphed.load_state_dict(model.state_dict())
    x = torch.randn(8, 64, device="hpu")
    with torch.no_grad():
        torch.testing.assert_close(graphed(x).cpu(), model(x).cpu())
        eager, replayed = _median_seconds(lambda: model(x)), _median_seconds(lambda: graphed(x))
    assert replayed < eager / 1.2, f"replay {replayed * 1e3:.3f} ms, op by op {eager * 1e3:.3f} ms"


@RunIf(hpu=True, physical="step time is the Gaudi's")
def test_a_training_step_is_faster_than_on_the_host():
    """A wide MLP's training step on one HPU takes less time than on the host CPU."""

    def step_on(device: str):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 4096)).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(256, 4096, device=device)

        def step() -> None:
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()

        step()  # warm-up: compilation on the HPU
        return step

    hpu, cpu = _median_seconds(step_on("hpu"), 10), _median_seconds(step_on("cpu"), 5)
    assert hpu < cpu, f"HPU {hpu * 1e3:.1f} ms per step, CPU {cpu * 1e3:.1f} ms"
