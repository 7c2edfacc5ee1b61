"""Running out of HPU memory ends the run with one clear error naming the device and the sizes, and exit code 1."""

import re

from tests_pytorch.helpers.runif import RunIf


@RunIf(virtual_hpu=True)  # sizes the device with VIRTUAL_HPU_MEMORY_MB and reads the virtual Gaudi's message
def test_out_of_memory_is_reported_and_the_process_exits(run):
    # a training step wants 256 MiB of activations on a device of 64 MiB
    scenario = run("oom", VIRTUAL_HPU_MEMORY_MB="64")
    assert scenario.finish(timeout=120) == 1, scenario.output[-3000:]
    assert scenario.seconds() < 120
    lines = [line for line in scenario.output.splitlines() if line.strip()]
    assert re.fullmatch(
        r"torch\.OutOfMemoryError: HPU out of memory on hpu:0: tried to allocate 256\.00 MiB; \d+\.\d\d MiB in use of"
        r" 64\.00 MiB limit \(VIRTUAL_HPU_MEMORY_MB\)",
        lines[-1],
    ), lines[-1]
    # the error itself, not one raised while cleaning up after it
    assert scenario.output.count("Traceback (most recent call last)") == 1
    assert "During handling of the above exception" not in scenario.output
