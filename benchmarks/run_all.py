"""Run every benchmark in this folder and print one summary table of their headline figures.

Each benchmark is a script ``benchmarks/<name>.py`` that measures side by side in one run and prints, as its last
line, ``<headline>=<float>``. ``--fast`` is passed on to each (run once, for smoke tests); a benchmark that fails or
breaks that format makes this script exit non-zero. Benchmarks run with one intra-op thread per process unless
``OMP_NUM_THREADS`` is set: on a shared machine with few cores, ops waiting for a second thread make step times swing
tenfold, and every comparison gives both of its sides the same setting.
"""

import os
import re
import subprocess
import sys
import time
from argparse import ArgumentParser
from pathlib import Path

BENCHMARK_ENV = {"OMP_NUM_THREADS": "1", **os.environ}
HEADLINE = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)=(?P<value>[-+0-9.eE]+|nan|inf)$")


def benchmark_scripts(folder: Path) -> list:
    return sorted(path for path in folder.glob("*.py") if not path.name.startswith("_") and path.name != "run_all.py")


def run(script: Path, fast: bool) -> tuple:
    """Run one benchmark with its output streamed through; return (headline name, value, seconds)."""
    command = [sys.executable, str(script)] + (["--fast"] if fast else [])
    start = time.perf_counter()
    process = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=BENCHMARK_ENV)
    seconds = time.perf_counter() - start
    print(process.stdout, end="", flush=True)
    lines = process.stdout.strip().splitlines()
    match = HEADLINE.match(lines[-1].strip()) if lines else None
    if process.returncode != 0 or match is None:
        raise RuntimeError(f"{script.name} exited with {process.returncode} or did not end with `<name>=<float>`")
    return match["name"], float(match["value"]), seconds


def main() -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="run each benchmark once (format smoke test)")
    args = parser.parse_args()
    rows, failures = [], []
    for script in benchmark_scripts(Path(__file__).parent):
        print(f"=== {script.name}", flush=True)
        try:
            rows.append((script.stem, *run(script, args.fast)))
        except RuntimeError as err:
            failures.append(str(err))
    print("=== summary")
    print(f"OMP_NUM_THREADS={BENCHMARK_ENV['OMP_NUM_THREADS']}, VIRTUAL_HPU={os.environ.get('VIRTUAL_HPU', 'unset')}")
    print("| benchmark | headline | value | seconds |\n|---|---|---|---|")
    for script, name, value, seconds in rows:
        print(f"| {script} | {name} | {value:.3f} | {seconds:.0f} |")
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
