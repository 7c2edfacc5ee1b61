"""``run.py`` scenarios in process groups of their own: follow their output, signal them, see their ranks end."""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import pytest

from tests_pytorch.helpers.processes import free_port

RUN = Path(__file__).with_name("run.py")


class Run:
    """One ``run.py`` scenario: its process (rank 0 or the only rank) leads a process group its ranks share."""

    def __init__(self, *args: str, **env: str) -> None:
        environment = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **env}
        for name in ("WORLD_SIZE", "LOCAL_RANK", "NODE_RANK"):  # as left by in-process fits of other tests
            environment.pop(name, None)
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, str(RUN), *args],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._new: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)
            self._new.put(line)
        self._new.put(None)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = 120) -> str:
        """The first new line containing ``text``; fails if the process ends or ``timeout`` passes first."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._new.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                pytest.fail(f"no {text!r} within {timeout} s:\n{self.output[-3000:]}")
            if line is None:
                pytest.fail(f"exited ({self.process.wait()}) before {text!r}:\n{self.output[-3000:]}")
            if text in line:
                return line

    def finish(self, timeout: float = 180) -> int:
        """Wait for the exit; the return code (negative: killed by that signal)."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"still running after {timeout} s:\n{self.output[-3000:]}")
        return code

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def signal(self, signum: int, group: bool = False) -> None:
        """Send ``signum`` to the process, or to every process of its group."""
        try:
            (os.killpg if group else os.kill)(self.process.pid, signum)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the whole group (ranks left behind included) and reap the process."""
        self.signal(signal.SIGKILL, group=True)
        self.process.wait()


def rank_pids(scenario: Run, ranks: int = 2) -> list[int]:
    """Wait until every rank says "rank <r> (pid <p>) at step 2", and return their process ids."""
    for _ in range(ranks):
        scenario.wait_for(" at step 2", timeout=240)
    return sorted({int(pid) for pid in re.findall(r"rank \d+ \(pid (\d+)\) at step 2", scenario.output)})


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie waiting for its parent counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_until_gone(pids: list[int], timeout: float) -> Optional[list[int]]:
    """Wait for the processes to end; those still running after ``timeout``, or ``None``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(pid) for pid in pids):
            return None
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]
