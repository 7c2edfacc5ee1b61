"""The README's demo trains to the promised accuracy, the way ``make demo`` runs it."""

import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).parents[2] / "examples" / "pytorch" / "hpu_classifier.py"


def test_demo_on_two_hpus_in_bf16():
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--devices", "2", "--precision", "bf16-mixed"],
        env={**os.environ, "MASTER_ADDR": "127.0.0.1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("final metrics")]
    assert "on 2 x HPUAccelerator" in line
    accuracy = float(re.search(r"test_acc=([0-9.]+)", line)[1])
    assert accuracy >= 0.90
