"""Lightning Fabric on the (virtual) Gaudi, as a Fabric user's script runs it: ``import lightning`` only.

Multi-process runs start ``helpers/fabric_run.py`` (it imports nothing of ours); each rank trains on its own rows and
saves its final parameters, so 2 ranks are compared with 1 process on the union of the rows.
"""

import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.fabric.loggers import CSVLogger
from lightning.fabric.strategies import ModelParallelStrategy
from lightning.fabric.utilities.exceptions import MisconfigurationException
from torch import nn

import lightning_fabric
from _lightning_hpu.connector import HPUConnector
from lightning_fabric.accelerators import HPUAccelerator
from lightning_fabric.plugins.io import HPUCheckpointIO
from lightning_fabric.plugins.precision import HPUDeepSpeedPrecision, HPUPrecision
from lightning_fabric.strategies import HPUDeepSpeedStrategy, SingleHPUStrategy
from tests_pytorch.helpers import fabric_run
from tests_pytorch.helpers.processes import free_port, rank_results
from tests_pytorch.helpers.runif import NEEDS_FSDP2, VARIANT, RunIf

FABRIC_RUN = Path(fabric_run.__file__)
SRC = str(Path(lightning_fabric.__file__).parents[1])


def _env(**extra: str) -> dict:
    # the ranks compute on the host: one thread each, as torchrun sets
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PT_HPU", "LOCAL_RANK", "RANK"))}
    return {**env, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **extra}


def _launch(out: Path, *args: str, **env: str) -> list:
    """``python fabric_run.py``: Fabric starts the other ranks itself (``fabric.launch()``)."""
    result = subprocess.run(
        [sys.executable, str(FABRIC_RUN), "--out", str(out), *args],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return rank_results(out)


def _union_in_process(tmp_path: Path, *args: str) -> dict:
    """One process on the union of the rows, here in the test process."""
    parser_args = ["--out", str(tmp_path), "--devices", "1", *args]
    sys_argv, sys.argv = sys.argv, ["fabric_run.py", *parser_args]
    try:
        fabric_run.main()
    finally:
        sys.argv = sys_argv
    return torch.load(tmp_path / "rank0.pt")


def _assert_parameters_close(first: dict, second: dict, tolerance: float) -> None:
    assert first.keys() == second.keys()
    for name in first:
        torch.testing.assert_close(first[name], second[name], rtol=tolerance, atol=tolerance, msg=name)


def test_lightning_fabric_picks_hpu_with_auto_and_resolves_it():
    fabric = L.Fabric(devices=1)
    assert type(fabric._connector) is HPUConnector
    assert isinstance(fabric.accelerator, HPUAccelerator)
    assert isinstance(fabric.strategy, SingleHPUStrategy)
    assert type(fabric._precision) is HPUPrecision
    assert fabric.device == torch.device("hpu", 0)
    assert isinstance(fabric.strategy.checkpoint_io, HPUCheckpointIO)


def test_nothing_changes_without_a_gaudi():
    code = (
        "import lightning as L; from lightning.fabric.connector import _Connector;"
        "f = L.Fabric(devices=1); print(type(f.accelerator).__name__, type(f._connector) is _Connector)"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("VIRTUAL_HPU")}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-2:] == ["CPUAccelerator", "True"]
    # and "hpu" is refused as upstream refuses an unknown accelerator
    result = subprocess.run(
        [sys.executable, "-c", "import lightning as L; L.Fabric(accelerator='hpu')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0 and "accelerator" in result.stderr


def test_two_ranks_with_launch_equal_one_process_on_the_union(tmp_path):
    ranks = _launch(tmp_path / "ddp", "--devices", "2", "--strategy", "ddp", "--clip", "1.0")
    union = _union_in_process(tmp_path, "--clip", "1.0")
    assert [rank["classes"]["strategy"] for rank in ranks] == ["HPUParallelStrategy"] * 2
    assert [rank["classes"]["device"] for rank in ranks] == ["hpu:0", "hpu:1"]
    assert {rank["classes"]["backend"] for rank in ranks} == {"hccl"}
    assert ranks[0]["gathered_rank"] == [[0], [1]]
    assert [rank["broadcast"] for rank in ranks] == [5, 5]
    # DDP's options are Intel's for HCCL: 230 MB buckets, gradients as views of them
    assert [rank["ddp_options"] for rank in ranks] == [[230 * 2**20, True]] * 2
    _assert_parameters_close(ranks[0]["parameters"], ranks[1]["parameters"], 0.0)
    # fp32: the same sums in another order
    _assert_parameters_close(ranks[0]["parameters"], union["parameters"], 1e-5)
    assert union["losses"][-1] < union["losses"][0]


def test_torchrun_starts_the_ranks(tmp_path):
    out = tmp_path / "torchrun"
    out.mkdir()
    env = _env()
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={env['MASTER_PORT']}",
        str(FABRIC_RUN),
        "--out",
        str(out),
        "--devices",
        "2",
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = rank_results(out)
    # "auto" with 2 devices: DDP over HCCL, one HPU per rank
    assert [rank["classes"]["device"] for rank in ranks] == ["hpu:0", "hpu:1"]
    assert {rank["classes"]["strategy"] for rank in ranks} == {"HPUParallelStrategy"}
    _assert_parameters_close(ranks[0]["parameters"], ranks[1]["parameters"], 0.0)
    _assert_parameters_close(ranks[0]["parameters"], _union_in_process(tmp_path)["parameters"], 1e-5)


def test_deepspeed_names_from_cuda_run_deepspeed_on_hpu(tmp_path):
    pytest.importorskip("deepspeed")
    ranks = _launch(tmp_path / "ds", "--devices", "2", "--strategy", "deepspeed_stage_2", "--precision", "bf16-mixed")
    assert {rank["classes"]["strategy"] for rank in ranks} == {"HPUDeepSpeedStrategy"}
    assert {rank["classes"]["precision"] for rank in ranks} == {"HPUDeepSpeedPrecision"}
    _assert_parameters_close(ranks[0]["parameters"], ranks[1]["parameters"], 0.0)
    # bf16: the engine's weights; both ranks step on the same averaged gradients
    assert ranks[0]["losses"][-1] < ranks[0]["losses"][0]
    assert ranks[0]["mean_loss"] == ranks[1]["mean_loss"]


@pytest.mark.parametrize(
    ("precision", "tolerance"), [pytest.param("32-true", 1e-5, marks=VARIANT), ("bf16-mixed", 5e-2)]
)
def test_fsdp_two_ranks_equal_one_process_on_the_union(tmp_path, precision, tolerance):
    ranks = _launch(tmp_path / "fsdp", "--devices", "2", "--strategy", "fsdp", "--precision", precision)
    assert {rank["classes"]["strategy"] for rank in ranks} == {"HPUFSDPStrategy"}
    assert {rank["classes"]["precision"] for rank in ranks} == {"HPUFSDPPrecision"}
    _assert_parameters_close(ranks[0]["parameters"], ranks[1]["parameters"], 0.0)
    # bf16: FSDP reduces the gradients in bf16, one process has nothing to reduce
    _assert_parameters_close(
        ranks[0]["parameters"], _union_in_process(tmp_path, "--precision", precision)["parameters"], tolerance
    )


@pytest.mark.parametrize(
    "strategy",
    [
        pytest.param("model_parallel_fsdp2", marks=(NEEDS_FSDP2, pytest.mark.heavy)),
        "model_parallel_tp",
    ],
)
def test_model_parallel_two_ranks_equal_one_process_on_the_union(tmp_path, strategy):
    """Upstream's ``ModelParallelStrategy(parallelize_fn, ...)`` instance, as a Fabric script passes it: FSDP2 over 2
    data-parallel ranks, or the layers split over 2 tensor-parallel ranks sharing the rows."""
    ranks = _launch(tmp_path / strategy, "--devices", "2", "--strategy", strategy, "--precision", "32-true")
    assert {rank["classes"]["strategy"] for rank in ranks} == {"HPUModelParallelStrategy"}
    assert {rank["classes"]["backend"] for rank in ranks} == {"hccl"}
    _assert_parameters_close(ranks[0]["parameters"], ranks[1]["parameters"], 0.0)
    union = _union_in_process(tmp_path, "--precision", "32-true")
    _assert_parameters_close(ranks[0]["parameters"], union["parameters"], 1e-5)
    assert ranks[0]["losses"][-1] < ranks[0]["losses"][0]


@NEEDS_FSDP2  # its model is sharded with fully_shard
def test_model_parallel_refuses_what_would_not_train(tmp_path):
    """Two scripts upstream runs without a word on CUDA and trains nothing, or not in the precision asked for."""
    with pytest.raises(ValueError, match="does not support `Fabric\\(..., precision='16-mixed'\\)` on HPUs"):
        L.Fabric(accelerator="hpu", strategy=ModelParallelStrategy(lambda m, _: m), precision="16-mixed")
    script = tmp_path / "optimizer_first.py"
    script.write_text(
        "import lightning as L, torch\n"
        "from lightning.fabric.strategies import ModelParallelStrategy\n"
        "from torch.distributed.fsdp import fully_shard\n"
        "fabric = L.Fabric(accelerator='hpu', devices=1,"
        " strategy=ModelParallelStrategy(lambda m, mesh: fully_shard(m, mesh=mesh['data_parallel'])))\n"
        "fabric.launch()\n"
        "model = torch.nn.Linear(4, 2)\n"
        "fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))\n"
    )
    result = subprocess.run([sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "The optimizer was created before `fabric.setup`" in result.stderr, result.stderr


# ddp resumes as fsdp does; its run (40 s) is a stress run, to keep the suite under its time
@pytest.mark.heavy
@pytest.mark.parametrize("strategy", [pytest.param("ddp", marks=pytest.mark.stress), "fsdp"])
def test_resumed_two_rank_run_equals_an_uninterrupted_one(tmp_path, strategy):
    checkpoint = tmp_path / "checkpoint"
    common = ("--devices", "2", "--strategy", strategy, "--steps", "2")
    _launch(tmp_path / "first", *common, "--checkpoint", str(checkpoint))
    resumed = _launch(tmp_path / "second", *common, "--resume", str(checkpoint))
    straight = _launch(tmp_path / "straight", "--devices", "2", "--strategy", strategy, "--steps", "4")
    assert [rank["step"] for rank in resumed] == [4, 4]
    for rank in (0, 1):
        assert resumed[rank]["losses"] == straight[rank]["losses"][2:]
        _assert_parameters_close(resumed[rank]["parameters"], straight[rank]["parameters"], 0.0)


# A Fabric user's script that notes, at the very end of its exit, which threads of torch's gloo backend (the virtual
# HCCL's) and TCP store are still running.
EXIT_SCRIPT = """
import atexit, os, sys
import lightning as L
import torch
from torch import nn

def backend_threads():
    names = (open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task"))
    return sorted(name for name in names if name.startswith(("pt_gloo", "gloo_", "pt_tcpstore")))

def note(rank):
    with open(os.path.join(sys.argv[1], f"rank{rank}.txt"), "w") as out:
        print(",".join(backend_threads()), file=out)

def train(fabric):
    model = nn.Linear(6, 3)
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    fabric.backward(model(torch.randn(4, 6, device=fabric.device)).sum())
    optimizer.step()
    fabric.broadcast(fabric.global_rank, src=0)
    RANKS.append(fabric.global_rank)

RANKS = []
# registered before Fabric starts, so it runs after the strategy's teardown: at-exit handlers run last in, first out
atexit.register(lambda: [note(rank) for rank in RANKS])
L.Fabric(accelerator="hpu", devices=2, strategy=sys.argv[2]).launch(train)
"""


@pytest.mark.heavy
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_process_group_ends_before_interpreter_shutdown(tmp_path, strategy):
    """The group's backend threads stop at exit while the interpreter still runs: left to its shutdown, a gloo thread
    that releases a finished collective's tensors cannot take the GIL, and the process aborts now and then."""
    script = tmp_path / "exit_script.py"
    script.write_text(EXIT_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path), strategy], env=_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    left = {rank: (tmp_path / f"rank{rank}.txt").read_text().strip() for rank in (0, 1)}
    assert left == {0: "", 1: ""}


@RunIf(virtual_hpu=True)  # counts graph cuts, host syncs and collectives, which the virtual Gaudi records
def test_lazy_mode_cuts_after_backward_and_step_without_host_syncs(tmp_path):
    ranks = _launch(
        tmp_path / "lazy", "--devices", "2", "--strategy", "hpu_parallel", "--steps", "6", PT_HPU_LAZY_MODE="1"
    )
    # every gradient fits DDP's first bucket: one all-reduce a step, of all of them
    gradient_bytes = sum(parameter.numel() for parameter in fabric_run.model().parameters()) * 4
    for rank in ranks:
        assert rank["per_step"] == {
            "mark_steps": [2],
            "host_syncs": [0],
            "graphs": [2],
            "all_reduces": [1],
            "collective_bytes": [gradient_bytes],
        }


@pytest.mark.parametrize(
    ("precision", "plugin", "parameter_dtype", "compute_dtype"),
    [
        ("32-true", "HPUPrecision", torch.float32, torch.float32),
        ("bf16-mixed", "HPUMixedPrecision", torch.float32, torch.bfloat16),
        ("16-mixed", "HPUMixedPrecision", torch.float32, torch.float16),
        ("bf16-true", "HPUHalfPrecision", torch.bfloat16, torch.bfloat16),
        ("16-true", "HPUHalfPrecision", torch.float16, torch.float16),
    ],
)
def test_precisions_on_one_hpu_step_like_the_cpu(precision, plugin, parameter_dtype, compute_dtype):
    def steps(accelerator: str) -> tuple:
        fabric = L.Fabric(accelerator=accelerator, devices=1, precision=precision)
        fabric.seed_everything(0)
        network = fabric_run.model()
        computed = []
        network[-1].register_forward_hook(lambda module, inputs, output: computed.append(output.dtype))
        optimizer = torch.optim.SGD(network.parameters(), lr=0.1)
        network, optimizer = fabric.setup(network, optimizer)
        inputs = fabric.to_device(torch.randn(8, 6, generator=torch.Generator().manual_seed(1)))
        losses = []
        for _ in range(3):
            output = network(inputs)
            loss = output.pow(2).mean()
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return fabric, network, computed[-1], output, losses

    fabric, network, computed, output, losses = steps("hpu")
    assert type(fabric._precision).__name__ == plugin
    assert next(network.parameters()).dtype == parameter_dtype
    assert computed == compute_dtype
    # as upstream's Fabric plugins do, outputs leave the model in the default type
    assert output.dtype == torch.float32
    # the CPU runs fp16 autocast as bf16; Gaudi's op lists keep some ops in fp32 where the CPU's autocast lowers them
    cpu_losses = steps("cpu")[4]
    tolerance = 0.0 if precision == "32-true" else 3e-2
    torch.testing.assert_close(losses, cpu_losses, rtol=tolerance, atol=tolerance)


def test_fp8_with_transformer_engine_flag():
    from habana_frameworks.torch.hpex.experimental import transformer_engine as te

    fabric = L.Fabric(accelerator="hpu", devices=1, precision="transformer-engine")
    assert type(fabric._precision).__name__ == "HPUFP8Precision"
    network = nn.Sequential(te.Linear(16, 16), nn.GELU(), te.Linear(16, 16))
    optimizer = torch.optim.SGD(network.parameters(), lr=0.1)
    network, optimizer = fabric.setup(network, optimizer)
    inputs = fabric.to_device(torch.randn(16, 16))
    losses = []
    for _ in range(3):
        loss = network(inputs).float().pow(2).mean()
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_save_load_round_trip_and_loggers(tmp_path):
    fabric = L.Fabric(accelerator="hpu", devices=1, precision="bf16-mixed", loggers=CSVLogger(tmp_path / "logs"))
    network = fabric_run.model()
    optimizer = torch.optim.AdamW(network.parameters(), lr=0.01)
    network, optimizer = fabric.setup(network, optimizer)
    inputs = fabric.to_device(torch.randn(8, 6))
    with fabric.no_backward_sync(network, enabled=True):
        fabric.backward(network(inputs).float().pow(2).mean())
    optimizer.step()
    fabric.log("loss", 1.5)
    fabric.logger.finalize("success")
    fabric.save(tmp_path / "state.ckpt", {"model": network, "optimizer": optimizer, "step": 1})
    assert not list(tmp_path.glob("*.tmp*"))

    restored = fabric_run.model()
    restored_optimizer = torch.optim.AdamW(restored.parameters(), lr=0.01)
    restored, restored_optimizer = fabric.setup(restored, restored_optimizer)
    state = {"model": restored, "optimizer": restored_optimizer}
    remainder = fabric.load(tmp_path / "state.ckpt", state)
    assert remainder == {"step": 1}
    for original, loaded in zip(network.parameters(), restored.parameters()):
        assert loaded.device.type == "hpu"
        torch.testing.assert_close(original, loaded, rtol=0, atol=0)
    assert restored_optimizer.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()
    assert "loss" in (tmp_path / "logs" / "lightning_logs" / "version_0" / "metrics.csv").read_text()


def test_lightning_habana_style_instances():
    fabric = L.Fabric(
        accelerator=HPUAccelerator(), strategy=SingleHPUStrategy(), plugins=[HPUPrecision(precision="bf16-mixed")]
    )
    assert type(fabric._precision).__name__ == "HPUMixedPrecision"
    assert isinstance(fabric.strategy, SingleHPUStrategy)
    assert type(fabric._connector) is HPUConnector
    deepspeed = L.Fabric(
        accelerator="hpu", strategy=HPUDeepSpeedStrategy(), plugins=[HPUDeepSpeedPrecision("bf16-mixed")]
    )
    assert deepspeed.strategy.precision.precision == "bf16-mixed"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"accelerator": "cpu", "strategy": "hpu_parallel"}, "runs on HPUs but `accelerator='cpu'`"),
        ({"accelerator": "hpu", "strategy": "dp"}, "is not supported with `accelerator='hpu'`"),
        ({"accelerator": "hpu", "precision": "64-true"}, "Gaudi has no float64"),
        ({"accelerator": "hpu", "devices": 2, "strategy": "hpu_single"}, "runs on one HPU"),
        ({"accelerator": "hpu", "devices": [1, 3]}, "only the first n HPUs can be chosen"),
    ],
)
def test_bad_inputs_refused_before_any_work(flags, message):
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        L.Fabric(**flags)
    assert isinstance(error.value, (ValueError, RuntimeError, MisconfigurationException))
    assert not torch.distributed.is_initialized()


@RunIf(virtual_hpu=True)  # simulates first-generation Gaudi
def test_fp16_refused_on_first_generation_gaudi():
    code = "import lightning as L; L.Fabric(accelerator='hpu', devices=1, precision='16-mixed')"
    env = {**os.environ, "VIRTUAL_HPU": "1", "VIRTUAL_HPU_GENERATION": "GAUDI"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "needs Gaudi2 or newer" in result.stderr and "Use `precision='bf16-mixed'`" in result.stderr


def test_setup_module_and_optimizers_separately_and_autocast():
    """``setup_module``/``setup_optimizers`` (as for FSDP-style code) and ``fabric.autocast()`` for code outside the
    model's forward."""
    fabric = L.Fabric(accelerator="hpu", devices=1, precision="bf16-mixed")
    network = fabric.setup_module(fabric_run.model())
    optimizer = fabric.setup_optimizers(torch.optim.SGD(network.parameters(), lr=0.1))
    assert next(network.parameters()).device.type == "hpu"
    inputs = fabric.to_device(torch.randn(4, 6))
    with fabric.autocast():
        # a matmul outside the model runs in bf16 too
        assert (inputs @ inputs.T).dtype == torch.bfloat16
    before = [parameter.detach().clone() for parameter in network.parameters()]
    fabric.backward(network(inputs).pow(2).mean())
    optimizer.step()
    assert any(not torch.equal(old, new) for old, new in zip(before, network.parameters()))
