"""Run every benchmark in this folder and print one summary table of their ratios, then one of their headlines.

Each benchmark is a script ``benchmarks/<name>.py`` that measures side by side in one run, prints each of its headline
ratios as a line ``ratio <name> = <median> [<min>, <max>] (target ≤ <target>: met|missed)`` (``_common.Ratio``: the
median over interleaved repetitions, with the smallest and largest value), and ends with ``<headline>=<float>``.
``--fast`` is passed on to each (one short repetition, for smoke tests); a benchmark that fails, runs longer than
``--timeout`` seconds or breaks that format makes this script exit non-zero. Benchmarks run with one intra-op thread per
process unless ``OMP_NUM_THREADS`` is set: on a shared machine with few cores, ops waiting for a second thread make step
times swing tenfold, and every comparison gives both of its sides the same setting.
"""

import os
import re
import sys
import time
from argparse import ArgumentParser
from pathlib import Path

from _common import CHILD_TIMEOUT, Ratio, print_table, run_process

BENCHMARK_ENV = {"OMP_NUM_THREADS": "1", **os.environ}
HEADLINE = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)=(?P<value>[-+0-9.eE]+|nan|inf)$")


def benchmark_scripts(folder: Path) -> list:
    return sorted(path for path in folder.glob("*.py") if not path.name.startswith("_") and path.name != "run_all.py")


def run(script: Path, fast: bool, timeout: float) -> tuple:
    """Run one benchmark and print its output; return (headline name, value, seconds, its ratios)."""
    command = [sys.executable, str(script)] + (["--fast"] if fast else [])
    start = time.perf_counter()
    code, stdout, stderr = run_process(command, BENCHMARK_ENV, timeout)
    seconds = time.perf_counter() - start
    print(stdout, end="", flush=True)
    lines = stdout.strip().splitlines()
    match = HEADLINE.match(lines[-1].strip()) if lines else None
    if code != 0 or match is None:
        raise RuntimeError(
            f"{script.name} exited with {code} or did not end with `<name>=<float>`:\n{stderr[-3000:]}".rstrip()
        )
    ratios = [ratio for ratio in map(Ratio.parse, lines) if ratio is not None]
    return match["name"], float(match["value"]), seconds, ratios


def main() -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="one short repetition of each benchmark (smoke test)")
    parser.add_argument("--timeout", type=float, default=CHILD_TIMEOUT, help="seconds a benchmark may take")
    args = parser.parse_args()
    headlines, ratios, failures = [], [], []
    for script in benchmark_scripts(Path(__file__).parent):
        print(f"=== {script.name}", flush=True)
        try:
            name, value, seconds, found = run(script, args.fast, args.timeout)
        except RuntimeError as err:
            print(err, flush=True)
            failures.append(script.stem)
            continue
        headlines.append([script.stem, name, f"{value:.3f}", f"{seconds:.0f}"])
        ratios += [[script.stem, ratio] for ratio in found]
    print("=== summary")
    print(f"OMP_NUM_THREADS={BENCHMARK_ENV['OMP_NUM_THREADS']}, VIRTUAL_HPU={os.environ.get('VIRTUAL_HPU', 'unset')}")
    print_table(
        ["benchmark", "ratio", "median [min, max]", "target", "status"],
        [[script, ratio.name, ratio.spread, _target(ratio), ratio.status] for script, ratio in ratios],
    )
    judged = [ratio for _, ratio in ratios if ratio.target is not None]
    met = sum(ratio.status == "met" for ratio in judged)
    print(f"{met} of {len(judged)} targets met (on the median; the spread shows how far noise reaches)")
    print_table(["benchmark", "headline", "value", "seconds"], headlines)
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures or not headlines else 0


def _target(ratio: Ratio) -> str:
    return "-" if ratio.target is None else f"≤ {ratio.target:g}"


if __name__ == "__main__":
    sys.exit(main())
