"""``benchmarks/run_all.py --fast`` runs every benchmark once and reports in the agreed format.

Not a timing test: it checks that each script prints a table and ends with ``<name>=<float>``, that the summary lists
them all, and what the benchmarks show that does not depend on timing (results equal bit for bit, graph cuts and host
syncs per step).
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
HEADLINE = re.compile(r"^([A-Za-z_][\w.]*)=([-+0-9.eE]+|nan|inf)$")
# every benchmark once: several minutes on 2 cores (graph_cuts runs 3 execution modes, deepspeed builds DeepSpeed's CPU
# communication op on its first run)
pytestmark = pytest.mark.timeout(960)
EXPECTED_HEADLINES = {
    "deepspeed": "deepspeed_ratio_max",
    "distributed": "ddp_ratio",
    "execution_modes": "compilations_per_step_compiled",
    "fabric": "fabric_ratio_max",
    "fp8": "fp8_step_ratio",
    "fsdp": "fsdp_ratio_max",
    "graph_cuts": "host_syncs_per_step_default",
    "performance_monitor": "monitor_overhead_ratio",
    "real_models": "ratio_max",
    "trainer_overhead": "overhead_ratio_max",
    "virtual_device": "ratio_max",
}


@pytest.fixture(scope="module")
def run_all() -> tuple:
    """(output of each benchmark by name, summary lines) of one ``run_all.py --fast``."""
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "run_all.py"), "--fast"], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    sections = re.split(r"^=== (\w+)(?:\.py)?$", result.stdout, flags=re.MULTILINE)
    outputs = dict(zip(sections[1::2], sections[2::2]))
    summary = outputs.pop("summary")
    return outputs, [line for line in summary.splitlines() if line.strip()]


@pytest.mark.slow
def test_every_benchmark_runs_and_ends_with_its_headline(run_all):
    outputs, _ = run_all
    scripts = {path.stem for path in BENCHMARKS.glob("*.py") if not path.name.startswith("_")} - {"run_all"}
    assert set(outputs) == scripts
    for name, output in outputs.items():
        lines = output.strip().splitlines()
        match = HEADLINE.match(lines[-1])
        assert match, f"{name}.py ended with {lines[-1]!r}"
        if name in EXPECTED_HEADLINES:
            assert match[1] == EXPECTED_HEADLINES[name]
        if name != "virtual_device":  # that one prints aligned columns of its own
            assert any(line.startswith("|-") for line in lines), f"{name}.py has no table"


@pytest.mark.slow
def test_summary_table_lists_each_headline(run_all):
    outputs, summary = run_all
    rows = [line for line in summary if line.startswith("| ") and not line.startswith("| benchmark")]
    assert summary[1] == "| benchmark | headline | value | seconds |"
    assert {row.split("|")[1].strip() for row in rows} == set(outputs)
    for row in rows:
        script, headline, value, seconds = (cell.strip() for cell in row.strip("|").split("|"))
        assert headline == EXPECTED_HEADLINES.get(script, headline)
        float(value), float(seconds)
    assert not [line for line in summary if line.startswith("FAILED")]


@pytest.mark.slow
def test_what_does_not_depend_on_timing(run_all):
    outputs, _ = run_all
    # the Trainer and the hand-written loop end with the same loss and weights, bit for bit
    rows = [line for line in outputs["trainer_overhead"].splitlines() if line.startswith(("| hpu", "| cpu"))]
    assert len(rows) == 3 and all(row.rstrip(" |").endswith("bitwise") for row in rows)
    # the Fabric loop and the hand-written loop end with the same loss and weights, bit for bit
    rows = [line for line in outputs["fabric"].splitlines() if line.startswith(("| hpu", "| cpu"))]
    assert len(rows) == 3 and all(row.rstrip(" |").endswith("bitwise") for row in rows)
    # DeepSpeed's loop on the HPU and on the CPU, and the Trainer with hpu_deepspeed_stage_2, end alike, bit for bit
    assert "bitwise equal, loop hpu and loop cpu: yes" in outputs["deepspeed"]
    # the demo has none of the hazards HPUPerformanceMonitor looks for
    assert "clean, no host syncs, recompilations or CPU fallbacks" in outputs["performance_monitor"]
    assert "bitwise equal, trainer hpu and loop hpu: yes" in outputs["deepspeed"]
    # hpu_parallel and CPU DDP end with the same loss
    assert "bitwise equal: yes" in outputs["distributed"]
    # FSDP: the loop on the HPU and on the CPU, and the Trainer with strategy="fsdp", end with the same loss
    assert "final losses equal, loop hpu and loop cpu: yes" in outputs["fsdp"]
    assert "final losses equal, trainer hpu and loop hpu: yes" in outputs["fsdp"]
    # a 2-process lazy-mode step with nothing logged: no host sync, two graphs, as on one device
    (hpu_row,) = [line for line in outputs["distributed"].splitlines() if line.startswith("| hpu ")]
    assert [cell.strip() for cell in hpu_row.strip("|").split("|")][4:6] == ["0.00", "2.00"]
    # nothing logged, in every execution mode: no host sync, with or without the bar; lazy mode cuts once after
    # backward and once after the optimizer step; compiled, no step recompiles
    cuts = {(row["logging"], row["progress bar"]): row for row in _table(outputs["graph_cuts"])}
    syncs = ("host syncs (lazy)", "host syncs (eager)", "host syncs (eager + compile)")
    no_sync = {"mark_steps (lazy)": 2.0, "graphs (lazy)": 2.0, "compilations (eager + compile)": 0.0}
    no_sync.update(dict.fromkeys(syncs, 0.0))
    for case in (("nothing", "off"), ("nothing", "default"), ("nothing, 2 processes (rank 0)", "off")):
        assert {key: float(cuts[case][key]) for key in no_sync} == no_sync, case
    # logging to the progress bar every step reads the value back once a step (and once more every
    # ``log_every_n_steps``), the same in every mode
    per_mode = {float(cuts[("prog_bar every step", "off")][key]) for key in syncs}
    assert len(per_mode) == 1 and 1.0 <= per_mode.pop() < 1.1
    # the default progress bar does not read the logged loss back after every step
    with_bar, without = cuts[("prog_bar every step", "default")], cuts[("prog_bar every step", "off")]
    for key in syncs:
        assert float(with_bar[key]) - float(without[key]) < 0.1, key
    # each execution mode of the demo model after warm-up: no host sync; lazy cuts two graphs; compiled, no step
    # recompiles and the training step has no graph break
    modes = {}
    for line in outputs["execution_modes"].splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0] in ("lazy", "eager", "eager + compile"):
            modes[cells[0]] = [float(cell) for cell in cells[1:5]]
    assert modes == {
        "lazy": [0.0, 2.0, 0.0, 0.0],
        "eager": [0.0, 0.0, 0.0, 0.0],
        "eager + compile": [0.0, 0.0, 0.0, 0.0],
    }


def _table(output: str) -> list:
    """The rows of the first Markdown table in ``output``, each a dict by column header."""
    lines = [line for line in output.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))) for line in lines[2:]]
