"""Invalid HPU configurations fail early, at ``Trainer(...)`` or before the first step, saying what is wrong and how
to fix it.

Each row is a configuration as a user writes it, the exception it must raise, and fragments of the message: the
offending value and the fix. Rows marked ``process`` need a fresh interpreter (the virtual Gaudi is configured when
``pytorch_lightning`` is imported); they run side by side in subprocesses.

``python tests/tests_pytorch/reliability/test_bad_inputs.py`` prints the table of configurations and messages.
"""

import json
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

import pytest
from lightning.pytorch.plugins.precision import DoublePrecision, MixedPrecision
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException

import pytorch_lightning as pl
from pytorch_lightning.plugins import HPUPrecisionPlugin
from pytorch_lightning.strategies import HPUParallelStrategy
from tests_pytorch.helpers.runif import RunIf

# variables a row may depend on; each row starts without them and sets only its own
_ISOLATED = (
    "WORLD_SIZE",
    "LOCAL_RANK",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOWER_LIST",
    "FP32_LIST",
    "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST",
    "PT_HPU_AUTOCAST_FP32_OPS_LIST",
    "SLURM_NTASKS",
    "TORCHELASTIC_RUN_ID",
    "LSB_JOBID",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
)
_NODE_ENV = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "NODE_RANK": "0"}


@dataclass(frozen=True)
class BadInput:
    config: str  # what the user wrote
    error: type  # the exception it must raise
    says: tuple[str, ...]  # message fragments: the offending value, and the fix
    run: Union[Callable[[Path], Any], str]  # in process (given a scratch directory), or code for a fresh process
    env: dict[str, str] = field(default_factory=dict)

    @property
    def in_process(self) -> bool:
        return not isinstance(self.run, str)

    @property
    def simulated(self) -> bool:
        """Whether the row sets up the virtual Gaudi itself (its knobs, another generation, or none at all)."""
        return "VIRTUAL_HPU" in self.env


def _trainer(**flags: Any) -> pl.Trainer:
    return pl.Trainer(
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **flags
    )


def _hpu(**flags: Any) -> Callable[[Path], Any]:
    return lambda _: _trainer(accelerator="hpu", **flags)


def _op_list(name: str, ops: list[str]) -> Callable[[Path], str]:
    def write(tmp: Path) -> str:
        (tmp / name).write_text("\n".join(ops) + "\n")
        return str(tmp / name)

    return write


def _activate(_: Path) -> None:
    import virtual_hpu

    # what ``import pytorch_lightning`` does: the knobs are read and checked before anything else starts
    virtual_hpu.activate_from_env()


_MISCONF, _GAUDI1 = MisconfigurationException, {"VIRTUAL_HPU": "1", "VIRTUAL_HPU_GENERATION": "GAUDI"}
ROWS = [
    # devices
    BadInput("accelerator='hpu', devices=0", _MISCONF, ("devices=0", "Pass a positive int"), _hpu(devices=0)),
    BadInput("accelerator='hpu', devices=-2", _MISCONF, ("devices=-2", "Pass a positive int"), _hpu(devices=-2)),
    BadInput("accelerator='hpu', devices=99", _MISCONF, ("devices=99", "or fewer"), _hpu(devices=99)),
    BadInput(
        "accelerator='hpu', devices=[1, 3]", _MISCONF, ("devices=[1, 3]", "only the first n"), _hpu(devices=[1, 3])
    ),
    BadInput(
        "accelerator='hpu', devices='1,3'", _MISCONF, ("devices=[1, 3]", "HABANA_VISIBLE_MODULES"), _hpu(devices="1,3")
    ),
    BadInput(
        "accelerator='hpu', devices='hpu:1'",
        _MISCONF,
        ("devices='hpu:1'", "Pass a positive int"),
        _hpu(devices="hpu:1"),
    ),
    BadInput("accelerator='hpu', devices=1.5", _MISCONF, ("devices=1.5", "Pass a positive int"), _hpu(devices=1.5)),
    BadInput(
        "strategy='hpu_single', devices=-1",
        _MISCONF,
        ("runs on one HPU", "Use `strategy='hpu_parallel'`"),
        _hpu(strategy="hpu_single", devices=-1),
    ),
    BadInput(
        "strategy='hpu_single', devices=2",
        _MISCONF,
        ("runs on one HPU", "or `devices=1`"),
        _hpu(strategy="hpu_single", devices=2),
    ),
    # strategies
    BadInput(
        "accelerator='hpu', strategy='hpu_paralel'",
        _MISCONF,
        ("'hpu_paralel'", "Choose one of hpu_ddp,"),
        _hpu(strategy="hpu_paralel"),
    ),
    BadInput(
        "accelerator='hpu', strategy='ddp_notebook'",
        _MISCONF,
        ("strategy='ddp_notebook'", "Use `strategy='hpu_parallel'`"),
        _hpu(strategy="ddp_notebook", devices=2),
    ),
    BadInput(
        "accelerator='hpu', strategy='ddp_fork'",
        _MISCONF,
        ("strategy='ddp_fork'", "'hpu_parallel_spawn'"),
        _hpu(strategy="ddp_fork", devices=2),
    ),
    BadInput(
        "accelerator='hpu', strategy='xla'",
        _MISCONF,
        ("strategy='xla'", "Choose one of hpu_ddp,"),
        _hpu(strategy="xla"),
    ),
    BadInput(
        "accelerator='hpu', strategy=<a user's DDPStrategy subclass>()",
        _MISCONF,
        ("OwnDDP()", "Choose one of hpu_ddp,"),
        # upstream's own strategy classes become their HPU counterparts; a subclass would lose its overrides
        lambda _: _trainer(accelerator="hpu", strategy=type("OwnDDP", (DDPStrategy,), {})()),
    ),
    BadInput(
        "accelerator='cpu', strategy='hpu_parallel'",
        _MISCONF,
        ("accelerator='cpu'", "Use `accelerator='hpu'`"),
        lambda _: _trainer(accelerator="cpu", strategy="hpu_parallel"),
    ),
    BadInput(
        "accelerator='cuda', strategy=HPUParallelStrategy()",
        _MISCONF,
        ("accelerator='cuda'", "Use `accelerator='hpu'`"),
        lambda _: _trainer(accelerator="cuda", strategy=HPUParallelStrategy()),
    ),
    # precision
    BadInput(
        "accelerator='hpu', precision='64-true'",
        ValueError,
        ("precision='64-true'", "Choose one of '32-true'"),
        _hpu(devices=1, precision="64-true"),
    ),
    BadInput(
        "accelerator='hpu', precision=64",
        ValueError,
        ("precision=64", "Choose one of '32-true'"),
        _hpu(devices=1, precision=64),
    ),
    BadInput(
        "accelerator='hpu', precision='half'",
        ValueError,
        ("precision='half'", "Choose one of '32-true'"),
        _hpu(devices=1, precision="half"),
    ),
    BadInput(
        "precision='16-mixed' on first-generation Gaudi",
        ValueError,
        ("'16-mixed'` needs Gaudi2", "Use `precision='bf16-mixed'`"),
        "import pytorch_lightning as pl; pl.Trainer(accelerator='hpu', devices=1, precision='16-mixed')",
        env=_GAUDI1,
    ),
    BadInput(
        "accelerator='hpu', plugins=[DoublePrecision()]",
        _MISCONF,
        ("DoublePrecision", "Pass `HPUPrecisionPlugin(precision=...)`"),
        lambda _: _trainer(accelerator="hpu", plugins=[DoublePrecision()]),
    ),
    BadInput(
        "accelerator='hpu', plugins=[MixedPrecision('bf16-mixed', 'cpu')]",
        _MISCONF,
        ("MixedPrecision", "Pass `HPUPrecisionPlugin(precision=...)`"),
        lambda _: _trainer(accelerator="hpu", plugins=[MixedPrecision("bf16-mixed", "cpu")]),
    ),
    BadInput(
        "precision='bf16-mixed', plugins=[HPUPrecisionPlugin('bf16-mixed')]",
        ValueError,
        ("precision=bf16-mixed", "Choose one"),
        lambda _: _trainer(accelerator="hpu", precision="bf16-mixed", plugins=[HPUPrecisionPlugin("bf16-mixed")]),
    ),
    BadInput(
        "HPUPrecisionPlugin('bf16-mixed', bf16_file_path='missing.txt')",
        FileNotFoundError,
        ("missing.txt", "Pass the path of a text file"),
        lambda tmp: HPUPrecisionPlugin("bf16-mixed", bf16_file_path=str(tmp / "missing.txt")),
    ),
    BadInput(
        "HPUPrecisionPlugin('bf16-mixed', fp32_file_path=<file naming 'lineer'>)",
        ValueError,
        ("'lineer'", "Use aten op names"),
        lambda tmp: HPUPrecisionPlugin("bf16-mixed", fp32_file_path=_op_list("fp32.txt", ["lineer"])(tmp)),
    ),
    BadInput(
        "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST=/nonexistent/lower.txt, precision='bf16-mixed'",
        FileNotFoundError,
        ("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", "Pass the path of a text file"),
        _hpu(devices=1, precision="bf16-mixed"),
        env={"PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST": "/nonexistent/lower.txt"},
    ),
    BadInput(
        "HPUPrecisionPlugin(hmp_params={'level': 'O1', 'bf16_list': ...})",
        ValueError,
        ("'bf16_list'", "The keys are 'level', 'verbose', 'bf16_ops', 'fp32_ops'"),
        lambda _: HPUPrecisionPlugin("bf16-mixed", hmp_params={"level": "O1", "bf16_list": []}),
    ),
    BadInput(
        "HPUPrecisionPlugin(verbose=True, hmp_params={'verbose': True})",
        ValueError,
        ("['verbose']", "pass one"),
        lambda _: HPUPrecisionPlugin("bf16-mixed", verbose=True, hmp_params={"verbose": True}),
    ),
    BadInput(
        "HPUPrecisionPlugin('bf16-mixed', opt_level='O2')",
        ValueError,
        ("opt_level='O2'", "Use `opt_level='O1'`"),
        lambda _: HPUPrecisionPlugin("bf16-mixed", opt_level="O2"),
    ),
    # processes and nodes
    BadInput(
        "num_nodes=2, devices=1 with WORLD_SIZE=3",
        _MISCONF,
        ("WORLD_SIZE=3", "num_nodes * devices == WORLD_SIZE"),
        _hpu(devices=1, num_nodes=2),
        env={**_NODE_ENV, "WORLD_SIZE": "3"},
    ),
    BadInput(
        "devices=2 with WORLD_SIZE=16 (one node of two)",
        _MISCONF,
        ("WORLD_SIZE=16", "num_nodes * devices == WORLD_SIZE"),
        _hpu(devices=2),
        env={"WORLD_SIZE": "16"},
    ),
    BadInput(
        "num_nodes=2 without MASTER_PORT",
        _MISCONF,
        ("needs MASTER_PORT", "`MASTER_PORT` to a free port"),
        _hpu(devices=1, num_nodes=2),
        env={"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "1"},
    ),
    BadInput(
        "num_nodes=2 without MASTER_ADDR, MASTER_PORT, NODE_RANK",
        _MISCONF,
        ("needs MASTER_ADDR, MASTER_PORT, NODE_RANK", "Set `MASTER_ADDR` to the address of node 0"),
        _hpu(devices=8, num_nodes=2),
    ),
    BadInput(
        "num_nodes=2 with MASTER_PORT=http",
        _MISCONF,
        ("MASTER_PORT=http", "Set a free port"),
        _hpu(devices=1, num_nodes=2),
        env={**_NODE_ENV, "MASTER_PORT": "http"},
    ),
    BadInput(
        "num_nodes=2 with NODE_RANK=2",
        _MISCONF,
        ("NODE_RANK=2", "Set it to a number from 0 to 1, a different one per node"),
        _hpu(devices=1, num_nodes=2),
        env={**_NODE_ENV, "NODE_RANK": "2"},
    ),
    BadInput(
        "accelerator='hpu', num_nodes=0",
        ValueError,
        ("got 0", "must be a positive integer"),
        _hpu(devices=1, num_nodes=0),
    ),
    # the device itself
    BadInput(
        "accelerator='hpu' with no Gaudi and VIRTUAL_HPU=0",
        _MISCONF,
        ("no Intel Gaudi is available", "set `VIRTUAL_HPU=1`"),
        "import pytorch_lightning as pl; pl.Trainer(accelerator='hpu')",
        env={"VIRTUAL_HPU": "0"},
    ),
    BadInput(
        "VIRTUAL_HPU_DEVICES=0 (at import)",
        ValueError,
        ("got '0'", "VIRTUAL_HPU_DEVICES must be an integer in"),
        "import pytorch_lightning",
        env={"VIRTUAL_HPU": "1", "VIRTUAL_HPU_DEVICES": "0"},
    ),
    BadInput(
        "VIRTUAL_HPU_DEVICES=17",
        ValueError,
        ("got '17'", "must be an integer in [1, 16]"),
        _activate,
        env={"VIRTUAL_HPU": "1", "VIRTUAL_HPU_DEVICES": "17"},
    ),
    BadInput(
        "VIRTUAL_HPU_MEMORY_MB=0",
        ValueError,
        ("got '0'", "VIRTUAL_HPU_MEMORY_MB must be an integer in [1, "),
        _activate,
        env={"VIRTUAL_HPU": "1", "VIRTUAL_HPU_MEMORY_MB": "0"},
    ),
    BadInput(
        "VIRTUAL_HPU_GENERATION=GAUDI4",
        ValueError,
        ("got 'GAUDI4'", "must be one of GAUDI, GAUDI2, GAUDI3"),
        _activate,
        env={"VIRTUAL_HPU": "1", "VIRTUAL_HPU_GENERATION": "GAUDI4"},
    ),
    BadInput(
        "VIRTUAL_HPU=yes", ValueError, ("got 'yes'", "must be 1 (on) or 0 (off)"), _activate, env={"VIRTUAL_HPU": "yes"}
    ),
    BadInput(
        "PT_HPU_LAZY_MODE=2",
        ValueError,
        ("got '2'", "must be 0 (eager) or 1 (lazy)"),
        _activate,
        env={"VIRTUAL_HPU": "1", "PT_HPU_LAZY_MODE": "2"},
    ),
]

# a probe for fresh processes: run the row's code, report the exception as JSON
_PROBE = """
import json, sys
try:
    exec(sys.argv[1])
except BaseException as error:
    print(json.dumps([type(error).__name__, str(error)]))
    sys.exit(1)
"""


@contextmanager
def _environment(env: dict[str, str]):
    saved = dict(os.environ)
    for name in _ISOLATED:
        os.environ.pop(name, None)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _start(row: BadInput) -> subprocess.Popen:
    env = {name: value for name, value in os.environ.items() if name not in _ISOLATED}
    return subprocess.Popen(
        [sys.executable, "-c", _PROBE, row.run],
        env={**env, **row.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _outcome(row: BadInput, tmp: Path, process: Optional[subprocess.Popen] = None) -> tuple[Optional[str], str]:
    """The name of the exception the row raised and its message (``None`` and the output if it raised nothing)."""
    if process is not None:
        stdout, stderr = process.communicate(timeout=120)
        lines = stdout.strip().splitlines()
        if process.returncode != 1 or not lines:
            return None, f"exit code {process.returncode}: {stdout}{stderr[-2000:]}"
        return tuple(json.loads(lines[-1]))
    with _environment(row.env):
        try:
            row.run(tmp)
        except Exception as error:
            return type(error).__name__, str(error)
    return None, "no exception"


@pytest.fixture(scope="module")
def processes():
    """Rows that need a fresh interpreter, started together."""
    started = {row.config: _start(row) for row in ROWS if not row.in_process}
    yield started
    for process in started.values():
        if process.poll() is None:
            process.kill()


_IDS = [row.config for row in ROWS]


def test_table_is_broad():
    assert len(ROWS) >= 25
    assert len({row.config for row in ROWS}) == len(ROWS)


@pytest.mark.parametrize(
    "row", [pytest.param(row, marks=[RunIf(virtual_hpu=True)] if row.simulated else []) for row in ROWS], ids=_IDS
)
def test_bad_input_fails_early_with_the_fix(row, tmp_path, processes):
    if row.in_process:
        with _environment(row.env), pytest.raises(row.error) as raised:
            row.run(tmp_path)
        name, message = type(raised.value).__name__, str(raised.value)
    else:
        name, message = _outcome(row, tmp_path, processes[row.config])
    assert name == row.error.__name__, message
    for fragment in row.says:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def main() -> None:
    """Print the table: configuration, exception, message."""
    started = {row.config: _start(row) for row in ROWS if not row.in_process}
    print("| configuration | exception | message |\n|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for row in ROWS:
            name, message = _outcome(row, Path(tmp), started.get(row.config))
            print(f"| `{row.config}` | {name} | {' '.join(message.split())} |")


if __name__ == "__main__":
    main()
