"""Per-call cost of the small ops models call most: on the HPU against the CPU, and in lazy mode against eager mode.

A small model's training step is mostly tiny ops, so its speed on the virtual Gaudi is decided by what each op costs on
its way through the device's dispatch, not by the arithmetic. The ops: ``a.add_(b)`` and ``a * b`` on 4 elements, a
``Linear(16, 16)`` and a ``LayerNorm(16)`` forward on a 2 x 16 input (autograd on, as in training), and a step of
``AdamW(foreach=True)`` over 4 parameters of 16 elements.

The execution mode is fixed per process (``PT_HPU_LAZY_MODE`` is read when the device activates), so one child process
runs in eager mode and one in lazy mode. In each repetition this script asks the two children in turn (the order flips
every repetition) to time every op in blocks of calls on CPU tensors and on HPU tensors, the devices alternating block
by block, and to report each device's median block: a block takes a fraction of a millisecond, so the scheduler's
interruptions on a busy machine fall on a few blocks, which the median leaves out. The repetitions are spread over
several pairs of children, started afresh: two processes running the same code differ by up to 6% per call (where
their memory happens to lie), which one pair would turn into a lasting bias of the lazy ÷ eager ratio.
Each HPU block ends with ``mark_step()``, the graph cut a lazy-mode loop makes. Per op it prints microseconds per call,
median [min, max] over repetitions, and two ratios, each the median over repetitions of that repetition's ratio, with
min and max: HPU ÷ CPU in eager mode (target <= 1.3) and lazy ÷ eager on the HPU (target <= 1.0: recording a lazy
graph must not cost more than running eagerly). Lazy ÷ eager on CPU tensors, which run the same code in both children,
is printed under it as the control: how far apart the two children's timings are when nothing differs. Last line
``tiny_op_ratio_max=<float>``, the largest median HPU ÷ CPU ratio in eager mode.

    python benchmarks/tiny_ops.py [--fast] [--repeats N] [--pairs N]
"""

import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from argparse import SUPPRESS, ArgumentParser
from collections.abc import Callable

from _common import CHILD_TIMEOUT, MODES, kill_group, print_table, spread, summarize, use_gaudi_or_virtual

use_gaudi_or_virtual()

# calls per timed block, so that a block takes a fraction of a millisecond
CALLS = {"add_": 200, "mul": 200, "Linear": 50, "LayerNorm": 50, "AdamW step": 5}
BLOCKS = 15  # blocks per device, op and repetition
HPU_TARGET, LAZY_TARGET = 1.3, 1.0
DEVICES = ("cpu", "hpu")


def build_ops(device: str) -> dict:
    """One call of each op on ``device``, by name."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    a, b = torch.rand(4, device=device), torch.rand(4, device=device)
    linear, norm = nn.Linear(16, 16).to(device), nn.LayerNorm(16).to(device)
    inputs = torch.randn(2, 16, device=device)
    parameters = [nn.Parameter(torch.randn(16, device=device)) for _ in range(4)]
    for parameter in parameters:
        parameter.grad = torch.randn(16, device=device)
    adamw = torch.optim.AdamW(parameters, lr=1e-3, foreach=True)
    ops: dict[str, Callable[[], object]] = {
        "add_": lambda: a.add_(b),
        "mul": lambda: a * b,
        "Linear": lambda: linear(inputs),
        "LayerNorm": lambda: norm(inputs),
        "AdamW step": adamw.step,
    }
    return ops


def child(blocks: int) -> None:
    """Serve the parent: for each line ``cpu,hpu`` (or ``hpu,cpu``) on stdin, time ``blocks`` blocks of every op on
    each device, alternating, starting in that order, and print one JSON line of the median microseconds per call,
    ``{op: {device: us}}``."""
    # torch first: in eager mode it activates the device, in lazy mode it sets up the hook that activates it on the
    # import of habana_frameworks, as the bridge does
    import torch  # noqa: F401, I001
    import habana_frameworks.torch.core as htcore

    ops = {device: build_ops(device) for device in DEVICES}
    for line in sys.stdin:
        order = line.strip().split(",")
        result: dict = {}
        for name, calls in CALLS.items():
            times: dict = {device: [] for device in order}
            for block in range(blocks):
                for device in order if block % 2 == 0 else order[::-1]:
                    op = ops[device][name]
                    start = time.perf_counter()
                    for _ in range(calls):
                        op()
                    if device == "hpu":
                        htcore.mark_step()
                    times[device].append((time.perf_counter() - start) / calls * 1e6)
            result[name] = {device: statistics.median(us) for device, us in times.items()}
        print(json.dumps(result), flush=True)


class Child:
    """A child process in one execution mode, answering one request at a time; it ends when its stdin closes."""

    def __init__(self, mode: str, blocks: int) -> None:
        env = {**os.environ, "PT_HPU_LAZY_MODE": MODES[mode][0]}
        self.mode = mode
        self.stderr = tempfile.TemporaryFile("w+")
        command = [sys.executable, __file__, "--child", "--blocks", str(blocks)]
        self.process = subprocess.Popen(
            command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
            start_new_session=True,
        )  # fmt: skip
        # lines are read on a thread, so that a child that hangs can be waited for with a timeout
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:  # type: ignore[union-attr]
            if line.startswith("{"):  # anything else a library prints is not an answer
                self.lines.put(line)
        self.lines.put(None)

    def time_ops(self, order: tuple) -> dict:
        """Microseconds per call of each op on each device, timed in ``order``."""
        self.process.stdin.write(",".join(order) + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        try:
            line = self.lines.get(timeout=CHILD_TIMEOUT)
        except queue.Empty:
            line = None
        if line is None:
            kill_group(self.process)
            self.stderr.seek(0)
            raise RuntimeError(f"the {self.mode}-mode child did not answer:\n{self.stderr.read()[-3000:]}")
        return json.loads(line)

    def close(self) -> None:
        """End the child: it exits when its stdin closes, or is killed when it does not."""
        try:
            self.process.stdin.close()  # type: ignore[union-attr]
            self.process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            kill_group(self.process)
        self.stderr.close()


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="one short repetition (smoke test)")
    parser.add_argument("--repeats", type=int, default=30, help="timed repetitions, spread over the pairs")
    parser.add_argument("--pairs", type=int, default=10, help="pairs of children the repetitions are spread over")
    parser.add_argument("--child", action="store_true", help=SUPPRESS)
    parser.add_argument("--blocks", type=int, default=BLOCKS, help=SUPPRESS)
    args = parser.parse_args()
    repeats, blocks, pairs = (1, 3, 1) if args.fast else (args.repeats, args.blocks, min(args.pairs, args.repeats))
    if args.child:
        child(blocks)
        return

    modes = ("eager", "lazy")
    samples: dict = {mode: [] for mode in modes}
    for pair in range(pairs):
        children = {mode: Child(mode, blocks) for mode in modes}
        try:
            for mode_child in children.values():
                mode_child.time_ops(DEVICES)  # each pair's warm-up: first calls allocate, load kernels, fill caches
            for repeat in range(pair * repeats // pairs, (pair + 1) * repeats // pairs):
                flip = repeat % 2 == 1
                for mode in reversed(modes) if flip else modes:
                    samples[mode].append(children[mode].time_ops(DEVICES[::-1] if flip else DEVICES))
        finally:
            for mode_child in children.values():
                mode_child.close()

    def us(mode: str, op: str, device: str) -> list:
        return [sample[op][device] for sample in samples[mode]]

    rows = []
    for op in CALLS:
        cells = [spread(us(mode, op, device), 3) for mode in modes for device in DEVICES]
        lazy_per_cpu = [h / c for h, c in zip(us("lazy", op, "hpu"), us("lazy", op, "cpu"))]
        rows.append([op, *cells, spread(lazy_per_cpu, 3)])
    print(
        f"microseconds per call, median [min, max] over {repeats} repetition(s) in {pairs} pair(s) of children,"
        f" each the median of {blocks} blocks"
        f" per device; calls per block: {', '.join(f'{op} {calls}' for op, calls in CALLS.items())}"
    )
    header = [f"{device} us ({mode})" for mode in modes for device in DEVICES]
    print_table(["op", *header, "hpu ÷ cpu (lazy)"], rows)
    eager = []
    for op in CALLS:
        ratios = [h / c for h, c in zip(us("eager", op, "hpu"), us("eager", op, "cpu"))]
        eager.append(summarize(f"{op}: hpu ÷ cpu, eager", ratios, HPU_TARGET).median)
    for op in CALLS:
        for device, target in (("hpu", LAZY_TARGET), ("cpu", None)):
            ratios = [lazy / eager for lazy, eager in zip(us("lazy", op, device), us("eager", op, device))]
            summarize(f"{op}: lazy ÷ eager, {device}", ratios, target)
    print(f"tiny_op_ratio_max={max(eager):.3f}")


if __name__ == "__main__":
    main()
