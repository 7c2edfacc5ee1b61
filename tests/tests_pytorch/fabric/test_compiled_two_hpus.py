"""``torch.compile(model)`` on 2 HPUs, as CUDA code writes it: Fabric (DDP, FSDP, DeepSpeed ZeRO-2) and the Trainer
(DDP, FSDP, FSDP2 compiled in ``configure_model``), each with torch's default backend and with ``hpu_backend``, train
like the same run uncompiled; in lazy mode a module compiled with the default backend runs uncompiled.

Each launch of ``helpers/compiled_run.py`` trains all of its cases in turn in the same 2 processes.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests_pytorch.helpers import compiled_run
from tests_pytorch.helpers.processes import free_port, rank_results
from tests_pytorch.helpers.runif import fsdp2_runs

COMPILED_RUN = Path(compiled_run.__file__)
MODES = ("none", "default", "hpu_backend")


def _run(out: Path, *args: str, **env: str) -> list:
    kept = {key: value for key, value in os.environ.items() if not key.startswith(("PT_HPU", "LOCAL_RANK", "RANK"))}
    kept.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), **env)
    command = [sys.executable, str(COMPILED_RUN), "--out", str(out), *args]
    result = subprocess.run(command, env=kept, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, result.stdout + result.stderr
    return rank_results(out)


def _assert_compiled_like_eager(ranks: list, strategies: tuple) -> None:
    assert len(ranks) == 2
    for rank in ranks:
        losses, compilations = rank["losses"], rank["compilations"]
        for strategy in strategies:
            eager = losses[strategy, "none"]
            assert len(eager) == compiled_run.STEPS
            assert compilations[strategy, "none"] == 0
            # dynamo captured the default-compiled module's graphs (the hpu_backend case after it finds them cached)
            assert compilations[strategy, "default"] > 0, strategy
            for how in MODES[1:]:
                # hpu_backend runs the same kernels in another order: float rounding only
                torch.testing.assert_close(losses[strategy, how], eager, rtol=1e-4, atol=1e-5, msg=(strategy, how))


@pytest.mark.heavy
@pytest.mark.slow
def test_fabric_two_hpus_compiled_train_like_eager(tmp_path):
    strategies = ("ddp", "fsdp", "deepspeed_stage_2")
    flags = ("--loop", "fabric", "--devices", "2", "--strategies", ",".join(strategies), "--compile", ",".join(MODES))
    _assert_compiled_like_eager(_run(tmp_path, *flags), strategies)


@pytest.mark.slow
def test_trainer_two_hpus_compiled_train_like_eager(tmp_path):
    strategies = ("ddp", "fsdp", "fsdp2") if fsdp2_runs() else ("ddp", "fsdp")  # FSDP2: torch 2.9+ (NO_FSDP2)
    flags = ("--loop", "trainer", "--devices", "2", "--strategies", ",".join(strategies), "--compile", ",".join(MODES))
    _assert_compiled_like_eager(_run(tmp_path, *flags), strategies)


@pytest.mark.slow
def test_lazy_mode_runs_a_default_compiled_module_uncompiled(tmp_path):
    flags = ("--devices", "2", "--strategies", "ddp", "--compile", "none,default")
    ranks = _run(tmp_path, *flags, PT_HPU_LAZY_MODE="1")
    for rank in ranks:
        torch.testing.assert_close(rank["losses"]["ddp", "default"], rank["losses"]["ddp", "none"])
