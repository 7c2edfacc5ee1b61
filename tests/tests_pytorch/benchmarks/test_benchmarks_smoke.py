"""``benchmarks/run_all.py --fast`` runs every benchmark once and reports in the agreed format.

That run takes minutes, so its tests are marked ``bench``: ``make test`` and CI (``.ci/run``) leave them out for time;
``pytest -m bench tests/tests_pytorch/benchmarks`` runs them before a release (``docs/source-pytorch/hpu_testing.rst``).

Not a timing test: it checks that each script prints a table, its headline ratios as ``ratio ...`` lines with their
spread and target, and ends with ``<name>=<float>``; that the summary lists every ratio and headline; and what the
benchmarks show that does not depend on timing (results equal bit for bit, graph cuts and host syncs per step). The
shared helpers of the benchmarks (the ratio line, the launch of two ranks) are checked on their own, quickly.
"""

import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests_pytorch.helpers.runif import RunIf

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
HEADLINE = re.compile(r"^([A-Za-z_][\w.]*)=([-+0-9.eE]+|nan|inf)$")
# every benchmark once: several minutes on 2 cores (graph_cuts runs 3 execution modes, deepspeed builds DeepSpeed's CPU
# communication op on its first run)
SMOKE_TIMEOUT = 900
EXPECTED_HEADLINES = {
    "ddp_collectives": "allreduce_calls_ratio",
    "deepspeed": "deepspeed_ratio_max",
    "distributed": "ddp_ratio_max",
    "execution_modes": "compilations_per_step_compiled",
    "fabric": "fabric_ratio_max",
    "fp8": "fp8_step_ratio",
    "fused_clip": "clip_ops_ratio",
    "fsdp": "fsdp_ratio_max",
    "graph_cuts": "host_syncs_per_step_default",
    "lightning_habana": "lightning_habana_ratio_max",
    "performance_monitor": "monitor_overhead_ratio",
    "real_models": "ratio_max",
    "tiny_ops": "tiny_op_ratio_max",
    "trainer_overhead": "overhead_ratio_max",
    "virtual_device": "ratio_max",
}
# benchmarks whose headline is a count, with no ratio to report
WITHOUT_RATIOS = {"graph_cuts"}


def _load_common():
    spec = importlib.util.spec_from_file_location("benchmarks_common", BENCHMARKS / "_common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


common = _load_common()


@pytest.fixture(scope="module")
def run_all() -> tuple:
    """(output of each benchmark by name, summary lines) of one ``run_all.py --fast``."""
    command = [sys.executable, str(BENCHMARKS / "run_all.py"), "--fast"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=SMOKE_TIMEOUT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    sections = re.split(r"^=== (\w+)(?:\.py)?$", result.stdout, flags=re.MULTILINE)
    outputs = dict(zip(sections[1::2], sections[2::2]))
    summary = outputs.pop("summary")
    return outputs, [line for line in summary.splitlines() if line.strip()]


@pytest.mark.bench
@RunIf(virtual_hpu=True)  # the benchmarks report the virtual Gaudi's own counts (graph cuts, host syncs)
@pytest.mark.timeout(SMOKE_TIMEOUT + 60)
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
        assert any(line.startswith("|-") for line in lines), f"{name}.py has no table"
        # every line that starts like a ratio is one, with its spread and target
        ratio_lines = [line for line in lines if line.startswith("ratio ")]
        assert all(common.Ratio.parse(line) for line in ratio_lines), ratio_lines
        assert bool(ratio_lines) == (name not in WITHOUT_RATIOS), name


@pytest.mark.bench
@RunIf(virtual_hpu=True)  # the benchmarks report the virtual Gaudi's own counts (graph cuts, host syncs)
@pytest.mark.timeout(SMOKE_TIMEOUT + 60)
def test_summary_tables_list_each_ratio_and_headline(run_all):
    outputs, summary = run_all
    tables = _tables(summary)
    assert [header for header, _ in tables] == [
        ["benchmark", "ratio", "median [min, max]", "target", "status"],
        ["benchmark", "headline", "value", "seconds"],
    ]
    (_, ratios), (_, headlines) = tables
    printed = [(name, common.Ratio.parse(line)) for name, output in outputs.items() for line in output.splitlines()]
    printed = [(name, ratio) for name, ratio in printed if ratio is not None]
    assert [(row["benchmark"], row["ratio"]) for row in ratios] == [(name, ratio.name) for name, ratio in printed]
    for row, (_, ratio) in zip(ratios, printed):
        assert row["median [min, max]"] == ratio.spread
        assert row["target"] == ("-" if ratio.target is None else f"≤ {ratio.target:g}")
        assert row["status"] == ratio.status
    assert {row["benchmark"] for row in headlines} == set(outputs)
    for row in headlines:
        assert row["headline"] == EXPECTED_HEADLINES.get(row["benchmark"], row["headline"])
        float(row["value"]), float(row["seconds"])
    assert not [line for line in summary if line.startswith("FAILED")]


@pytest.mark.bench
@RunIf(virtual_hpu=True)  # the benchmarks report the virtual Gaudi's own counts (graph cuts, host syncs)
@pytest.mark.timeout(SMOKE_TIMEOUT + 60)
def test_what_does_not_depend_on_timing(run_all):
    outputs, _ = run_all
    # the Trainer and the hand-written loop end with the same loss and weights, bit for bit
    rows = [line for line in outputs["trainer_overhead"].splitlines() if line.startswith(("| hpu", "| cpu"))]
    assert len(rows) == 4 and all(row.rstrip(" |").endswith("bitwise") for row in rows)
    # the Fabric loop and the hand-written loop end with the same loss and weights, bit for bit
    rows = [line for line in outputs["fabric"].splitlines() if line.startswith(("| hpu", "| cpu"))]
    assert len(rows) == 3 and all(row.rstrip(" |").endswith("bitwise") for row in rows)
    # DeepSpeed's loop on the HPU and on the CPU, and the Trainer with hpu_deepspeed_stage_2, end alike, bit for bit
    assert "bitwise equal, loop hpu and loop cpu: yes" in outputs["deepspeed"]
    # the demo has none of the hazards HPUPerformanceMonitor looks for
    assert "clean, no host syncs, recompilations or CPU fallbacks" in outputs["performance_monitor"]
    assert "bitwise equal, trainer hpu and loop hpu: yes" in outputs["deepspeed"]
    # hpu_parallel and CPU DDP, each with the hand-written DDP loop in lockstep, end with the same loss
    assert "final losses bitwise equal, Trainer and loop on each device: yes" in outputs["distributed"]
    assert "final losses bitwise equal, hpu and cpu: yes" in outputs["distributed"]
    # FSDP: the loop on the HPU and on the CPU, and the Trainer with strategy="fsdp", end with the same loss
    assert "final losses equal, loop hpu and loop cpu: yes" in outputs["fsdp"]
    assert "final losses equal, trainer hpu and loop hpu: yes" in outputs["fsdp"]
    # a 2-process lazy-mode step with nothing logged: no host sync, two graphs, as on one device, with the Trainer as
    # in the hand-written loop
    steps = {row["kind"]: row for row in _tables(outputs["distributed"].splitlines())[0][1]}
    for kind in ("trainer hpu", "loop hpu"):
        assert [steps[kind]["host syncs/step"], steps[kind]["graphs/step"]] == ["0.00", "2.00"], kind
    # nothing logged, in every execution mode: no host sync, with or without the bar; lazy mode cuts once after
    # backward and once after the optimizer step; compiled, no step recompiles
    cuts = {(row["logging"], row["progress bar"]): row for row in _tables(outputs["graph_cuts"].splitlines())[0][1]}
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
    # DDP over 2 HPUs: Intel's options for HCCL send the same gradients in fewer all-reduces than torch's
    variants = {row["variant"]: row for row in _tables(outputs["ddp_collectives"].splitlines())[0][1]}
    calls = {variant: float(row["all-reduces per step"].split()[0]) for variant, row in variants.items()}
    sent = {variant: row["collective MiB per step"].split()[0] for variant, row in variants.items()}
    assert calls["gaudi"] < calls["torch"] and sent["gaudi"] == sent["torch"], variants
    # clipping 72 gradients: Gaudi's fused clip-norm reaches the device as a couple of ops, torch's as two per gradient
    clips = {row["clip"]: int(row["device ops per clip"]) for row in _tables(outputs["fused_clip"].splitlines())[0][1]}
    assert clips["fused (Lightning on HPU)"] <= 2 and clips["torch clip_grad_norm_"] >= 2 * 72, clips
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


def _tables(lines: list) -> list:
    """The Markdown tables among ``lines``, each as (header, rows as dicts by column header)."""
    tables, rows = [], []
    for line in [*lines, ""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            header, _, *body = rows
            tables.append((header, [dict(zip(header, row)) for row in body]))
            rows = []
    return tables


def test_a_ratio_line_states_median_spread_and_target_and_reads_back():
    met = common.Ratio.of("a ÷ b", [1.2, 0.9, 1.0, 1.1, 5.0], 1.1)
    assert (met.median, met.low, met.high, met.status) == (1.1, 0.9, 5.0, "met")
    assert str(met) == "ratio a ÷ b = 1.100 [0.900, 5.000] (target ≤ 1.1: met)"
    assert common.Ratio.parse(str(met)) == met
    missed = common.Ratio.of("hpu 32-true: Trainer ÷ loop", [1.04, 1.05, 1.06], 1.03)
    assert str(missed).endswith("(target ≤ 1.03: missed)")
    assert common.Ratio.parse(str(missed)) == missed
    reference = common.Ratio.of("cpu: x ÷ y", [2.0], None)
    assert (str(reference), reference.status) == ("ratio cpu: x ÷ y = 2.000 [2.000, 2.000] (no target)", "no target")
    assert common.Ratio.parse(str(reference)) == reference
    assert common.Ratio.parse("ratio_max=1.2") is None


WORKER = """
import json, os, sys, time
sys.path.insert(0, {benchmarks!r})
from _common import fit_groups

if sys.argv[1] == "--worker":
    if sys.argv[2] == "fail":  # rank 1 fails at once; rank 0 would wait for it forever
        if os.environ["RANK"] == "1":
            sys.exit(3)
        time.sleep(600)
    if sys.argv[2] == "hang":
        time.sleep(600)
    next_fit, ports = fit_groups(), []
    for _ in range(3):
        next_fit()
        ports.append(int(os.environ["MASTER_PORT"]))
    print(json.dumps({{"rank": os.environ["RANK"], "ports": ports}}))
    with open(sys.argv[3] + os.environ["RANK"], "w") as file:
        json.dump(ports, file)
"""


@pytest.fixture
def worker(tmp_path: Path) -> Path:
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(benchmarks=str(BENCHMARKS)))
    return script


def test_the_ranks_of_a_pair_agree_on_a_fresh_port_for_every_fit(worker: Path, tmp_path: Path):
    result = common.launch_pair(str(worker), ["ports", str(tmp_path / "ports")], timeout=120)
    ranks = [json.loads((tmp_path / f"ports{rank}").read_text()) for rank in (0, 1)]
    assert result["ports"] == ranks[0] == ranks[1]
    assert len(set(ranks[0])) == 3


def test_a_failing_rank_ends_the_pair_at_once_with_its_error(worker: Path):
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1 exited with 3"):
        common.launch_pair(str(worker), ["fail"], timeout=120)
    assert time.monotonic() - start < 60  # rank 0 sleeps 600 s: it was killed


def test_a_pair_that_runs_too_long_is_stopped(worker: Path):
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="still running after 2 s"):
        common.launch_pair(str(worker), ["hang"], timeout=2)
    assert time.monotonic() - start < 60
