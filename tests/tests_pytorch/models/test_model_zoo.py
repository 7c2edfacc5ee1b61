"""Real models train on HPU like on CPU: every zoo model, precision and execution mode, step by step.

The zoo (``tests_pytorch/helpers/model_zoo.py``) is Hugging Face GPT-2, BERT, Llama, Mixtral (a mixture of experts), T5
and ViT from tiny configs, and ``torch.nn`` building blocks. Each process trains every model in every precision; one
process per accelerator and execution mode (lazy or eager is fixed when the Gaudi is activated), and a subset on two
devices against CPU DDP and with Lightning Fabric's loop against the same loop on CPU.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests_pytorch.helpers.model_zoo import MODELS, PRECISIONS

SCRIPT = Path(__file__).parents[1] / "helpers" / "model_zoo.py"
MODES = {"lazy": "1", "eager": "0"}
PARALLEL_MODELS = ("gpt2", "llama", "vit", "convolutions")
PARALLEL_PRECISIONS = ("32-true", "bf16-mixed", "bf16-true")
FABRIC_MODELS = ("gpt2", "llama", "vit", "norms", "transformer_layers", "multihead_attention")

# Relative tolerance on each step's loss, from the unit roundoff of the type the models compute in, with headroom for
# a few steps of updates that start from slightly different weights:
# - 32-true: the virtual Gaudi runs the same fp32 kernels; only the order of a few reductions may differ (fp32 ulp is
#   1.2e-7).
# - bf16-mixed / 16-mixed: matmuls and convolutions run in bf16 (8 significant bits, roundoff 2^-8 = 3.9e-3) or fp16
#   (11 bits, 4.9e-4), and Gaudi's autocast lists put other ops in lower precision than CPU's lists do (e.g. softmax,
#   GELU), so CPU and HPU round differently; the loss itself is computed in fp32.
# - bf16-true: the weights and the loss are bf16 scalars too; the step's loss is known only to one bf16 ulp
#   (2^-7 relative below a power of two), two ulps allowed.
TOLERANCES = {"32-true": 1e-5, "bf16-mixed": 1e-2, "16-mixed": 2e-3, "bf16-true": 2**-6}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(
    out: Path, accelerator: str, devices: int = 1, mode: str = "lazy", *flags: str, **args: str
) -> subprocess.Popen:
    # one intra-op thread: the same reduction order in every process, and no contention between the runs
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PT_HPU_LAZY_MODE": MODES[mode]}
    if devices > 1:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    command = [sys.executable, str(SCRIPT), "--accelerator", accelerator, "--devices", str(devices), "--out", str(out)]
    command += [*flags, *(f"--{key}={value}" for key, value in args.items())]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _results(runs: dict) -> dict:
    """Wait for the runs ``{key: (process, output files)}``; ``{key: [losses of each file]}``."""
    results = {}
    for key, (process, files) in runs.items():
        output, _ = process.communicate(timeout=600)
        assert process.returncode == 0, f"zoo run {key} exited with {process.returncode}:\n{output[-3000:]}"
        results[key] = [json.loads(file.read_text()) for file in files]
    return results


@pytest.fixture(scope="module")
def single_device(tmp_path_factory) -> dict:
    """``{"cpu" | "lazy" | "eager": {"<model>/<precision>": losses or error}}``, the three processes side by side."""
    folder = tmp_path_factory.mktemp("zoo")
    runs = {"cpu": (_start(folder / "cpu.json", "cpu"), [folder / "cpu.json"])}
    for mode in MODES:
        runs[mode] = (_start(folder / f"{mode}.json", "hpu", mode=mode), [folder / f"{mode}.json"])
    return {key: files[0] for key, files in _results(runs).items()}


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory) -> dict:
    """``{"cpu" | "lazy" | "eager": [results of rank 0, results of rank 1]}`` on two devices."""
    folder = tmp_path_factory.mktemp("zoo_parallel")
    subset = {"models": ",".join(PARALLEL_MODELS), "precisions": ",".join(PARALLEL_PRECISIONS)}
    runs = {}
    for key, accelerator, mode in (("cpu", "cpu", "lazy"), ("lazy", "hpu", "lazy"), ("eager", "hpu", "eager")):
        out = folder / f"{key}.json"
        runs[key] = (_start(out, accelerator, 2, mode, **subset), [Path(f"{out}.rank{rank}") for rank in (0, 1)])
    return _results(runs)


@pytest.fixture(scope="module")
def fabric_single_device(tmp_path_factory) -> dict:
    """As ``single_device``, each model trained by a Lightning Fabric loop."""
    folder = tmp_path_factory.mktemp("zoo_fabric")
    subset = {"models": ",".join(FABRIC_MODELS)}
    runs = {"cpu": (_start(folder / "cpu.json", "cpu", 1, "lazy", "--fabric", **subset), [folder / "cpu.json"])}
    for mode in MODES:
        out = folder / f"{mode}.json"
        runs[mode] = (_start(out, "hpu", 1, mode, "--fabric", **subset), [out])
    return {key: files[0] for key, files in _results(runs).items()}


def _assert_trains_like_cpu(case: str, losses, reference, tolerance: float) -> None:
    """Each step's loss within ``tolerance`` of CPU's; fails naming the case."""
    if isinstance(reference, str):
        pytest.fail(f"{case} fails on CPU, the reference: {reference}")
    if isinstance(losses, str):
        pytest.fail(f"{case} fails on HPU: {losses}")
    assert len(losses) == len(reference), f"{case}: {len(losses)} steps on HPU, {len(reference)} on CPU"
    differences = [abs(hpu - cpu) / abs(cpu) for hpu, cpu in zip(losses, reference)]
    assert max(differences) <= tolerance, (
        f"{case}: loss per step on HPU {losses} differs from CPU {reference} by up to {max(differences):.2e}"
        f" (relative), more than the {tolerance:.1e} of this precision"
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("model", MODELS)
def test_trains_like_cpu(single_device, model, precision, mode):
    key, case = f"{model}/{precision}", f"{model} in {precision}, {mode} mode"
    _assert_trains_like_cpu(case, single_device[mode][key], single_device["cpu"][key], TOLERANCES[precision])


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("precision", PARALLEL_PRECISIONS)
@pytest.mark.parametrize("model", PARALLEL_MODELS)
def test_trains_on_two_devices_like_cpu_ddp(two_devices, model, precision, mode):
    key = f"{model}/{precision}"
    for rank, (hpu, cpu) in enumerate(zip(two_devices[mode], two_devices["cpu"])):
        case = f"{model} in {precision}, {mode} mode, rank {rank} of hpu_parallel vs CPU DDP"
        _assert_trains_like_cpu(case, hpu[key], cpu[key], TOLERANCES[precision])


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("model", FABRIC_MODELS)
def test_fabric_trains_like_cpu(fabric_single_device, model, precision, mode):
    key, case = f"{model}/{precision}", f"{model} in {precision} with Fabric, {mode} mode"
    _assert_trains_like_cpu(
        case, fabric_single_device[mode][key], fabric_single_device["cpu"][key], TOLERANCES[precision]
    )
