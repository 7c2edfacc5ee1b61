"""The documentation builds without a warning, and its Python code runs as written, on the virtual Gaudi.

Every ``.. code-block:: python`` of ``docs/source-pytorch`` and every ```` ```python ```` block of the README runs;
the blocks of one page run in order in one fresh interpreter, so a later block may use what an earlier one defined,
as a reader would. Before them runs ``PRELUDE``: the imports every page assumes, and the ``model`` and data loaders
that fragments pass to the Trainer; the op-list files that examples name exist in the working folder. Fits are
capped by ``PL_TRAINER_*`` defaults (a few steps and batches), which arguments a block passes explicitly override.
A block that cannot run here (it needs 8 real cards, a second node, ...) is preceded by a comment line
``.. not-runnable: <reason>`` (``<!-- not-runnable: <reason> -->`` in Markdown); the reason is required. A block
preceded by ``.. new-process: <reason>`` starts a fresh interpreter (in the same working folder) for itself and the
blocks after it, as a page that tells the reader to run it in a new process (fp8 quantization after measurement).
A block preceded by ``.. needs-torch: <major.minor>`` runs where torch is that release or newer, and is skipped before
it, as the page's minimum says (``hpu_torch.rst``, "What needs a newer torch").
"""

import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Optional

import pytest

import virtual_hpu
from tests_pytorch.helpers.processes import free_port
from tests_pytorch.helpers.runif import RunIf
from virtual_hpu import torch_support

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs" / "source-pytorch"
RST_BLOCK = re.compile(r"^\.\. code-block:: (\w+)\s*$")
SKIP = re.compile(r"^(?:\.\. |<!-- )not-runnable:\s*(\S.*?)\s*(?:-->)?$")
NEW_PROCESS = re.compile(r"^\.\. new-process:\s*\S")
NEEDS_TORCH = re.compile(r"^\.\. needs-torch:\s*(\d+)\.(\d+)\s*$")


def _skip_reason(previous: str) -> Optional[str]:
    """Why the block after the line ``previous`` does not run here, or None."""
    skip = SKIP.match(previous)
    if skip:
        return skip[1]
    needs = NEEDS_TORCH.match(previous)
    if needs and torch_support.installed() < torch_support.TorchRelease(int(needs[1]), int(needs[2])):
        return f"needs torch {needs[1]}.{needs[2]} or newer"
    return None


def _rst_blocks(text: str) -> list:
    """(first line number, code, skip reason or None) of each Python block of a reStructuredText page; the code of a
    block that starts a new process begins with ``NEW_PROCESS_MARK``."""
    lines, blocks = text.splitlines(), []
    for number, line in enumerate(lines):
        match = RST_BLOCK.match(line)
        if not match or match[1] != "python":
            continue
        previous = next((lines[i] for i in range(number - 1, -1, -1) if lines[i].strip()), "")
        skip = _skip_reason(previous)
        body, index = [], number + 1
        while index < len(lines) and lines[index].strip().startswith(":"):  # directive options
            index += 1
        while index < len(lines) and (not lines[index].strip() or lines[index].startswith((" ", "\t"))):
            body.append(lines[index])
            index += 1
        code = textwrap.dedent("\n".join(body))
        blocks.append((number + 1, NEW_PROCESS_MARK + code if NEW_PROCESS.match(previous) else code, skip))
    return blocks


def _markdown_blocks(text: str) -> list:
    blocks, previous = [], ""
    for match in re.finditer(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        before = [line for line in text[: match.start()].splitlines() if line.strip()]
        previous = before[-1] if before else ""
        blocks.append((text[: match.start()].count("\n") + 1, match[1], _skip_reason(previous)))
    return blocks


NEW_PROCESS_MARK = "# new process\n"
PRELUDE = """
import torch
from torch import nn
from lightning.pytorch.demos.boring_classes import BoringModel

import pytorch_lightning as pl

model = BoringModel()
train_loader = train_dataloader = model.train_dataloader()
"""
LIMITS = {
    "PL_TRAINER_MAX_STEPS": "3",
    "PL_TRAINER_LIMIT_VAL_BATCHES": "2",
    "PL_TRAINER_LIMIT_TEST_BATCHES": "2",
    "PL_TRAINER_LIMIT_PREDICT_BATCHES": "2",
}
# the page on the virtual Gaudi shows how to activate it from code, which a process started with VIRTUAL_HPU=1 refuses;
# the scale-out page builds a 2-node Trainer, which needs the rendezvous variables of node 0 (it does not fit)
# HPU graphs are a lazy-mode feature on Gaudi
PAGE_ENV = {
    "virtual_hpu.rst": {"VIRTUAL_HPU": "0"},
    "hpu_intermediate.rst": {"NODE_RANK": "0"},
    "hpu_graphs.rst": {"PT_HPU_LAZY_MODE": "1"},
}
OP_LISTS = {"ops_bf16.txt": "linear\nmatmul\n", "ops_fp32.txt": "softmax\n"}

PAGES = sorted(DOCS.glob("*.rst")) + [ROOT / "README.md"]
# pages whose examples check what only the virtual Gaudi records, as the page says
VIRTUAL_ONLY = {"hpu_porting.rst": "its HPUPerformanceMonitor example asserts the host syncs the virtual Gaudi records"}
# pages whose examples take 30 to 55 s (several processes, fp8 measurement): make test-heavy runs them, in CI too, to
# keep make test within its 20 minutes on torch 2.11
LONG_PAGES = {"hpu_fabric.rst", "hpu_profiler.rst", "hpu_fp8.rst"}


def _marks(page: Path) -> list:
    return [RunIf(virtual_hpu=True)] * (page.name in VIRTUAL_ONLY) + [pytest.mark.heavy] * (page.name in LONG_PAGES)


def _blocks(page: Path) -> list:
    text = page.read_text()
    return _markdown_blocks(text) if page.suffix == ".md" else _rst_blocks(text)


def _runnable(page: Path) -> list:
    return [(line, code) for line, code, skip in _blocks(page) if skip is None]


def test_the_parser_finds_blocks_and_markers():
    page = (
        ".. not-runnable: needs 8 cards\n.. code-block:: python\n\n    a = 1\n\n.. code-block:: python\n\n    b = a\n"
    )
    assert _rst_blocks(page) == [(2, "\na = 1\n", "needs 8 cards"), (6, "\nb = a", None)]
    second = _rst_blocks(
        ".. code-block:: python\n\n    a = 1\n\n.. new-process: as the page says\n.. code-block:: python\n\n    b = 2\n"
    )
    assert second == [(1, "\na = 1\n", None), (6, NEW_PROCESS_MARK + "\nb = 2", None)]
    newer = _rst_blocks(".. needs-torch: 99.0\n.. code-block:: python\n\n    a = 1\n")
    assert newer == [(2, "\na = 1", "needs torch 99.0 or newer")]
    assert _rst_blocks(".. needs-torch: 2.6\n.. code-block:: python\n\n    a = 1\n") == [(2, "\na = 1", None)]
    assert len([block for page in PAGES for block in _blocks(page)]) >= 20


@pytest.mark.parametrize(
    "page",
    [pytest.param(page, marks=_marks(page)) for page in PAGES if _runnable(page)],
    ids=lambda page: page.name,
)
def test_python_blocks_run(page, tmp_path):
    processes: list = []
    for line, code in _runnable(page):
        if not processes or code.startswith(NEW_PROCESS_MARK):
            processes.append([])
        processes[-1].append((line, code))
    for name, content in OP_LISTS.items():
        (tmp_path / name).write_text(content)
    for blocks in processes:
        _run_blocks(page, blocks, tmp_path)


def _run_blocks(page: Path, blocks: list, folder: Path) -> None:
    # each block is compiled on its own so that a failure names the page's line
    script = folder / "page.py"  # a file, as the multi-device examples start one process per device from it
    script.write_text(
        PRELUDE + "\n".join(f"exec(compile({code!r}, {f'{page.name}:{line}'!r}, 'exec'))" for line, code in blocks)
    )
    env = {
        **os.environ,
        # the examples run on the Gaudi there is: the virtual one unless Gaudi's software is installed
        "VIRTUAL_HPU": "0" if virtual_hpu.real_installation() else "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        **LIMITS,
        **PAGE_ENV.get(page.name, {}),
    }
    result = subprocess.run(
        [sys.executable, str(script)], cwd=folder, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"{page.name}:\n{result.stderr[-4000:]}"


MARKED = [
    (page, line, reason)
    for page in PAGES
    for line, _, reason in _blocks(page)
    if reason is not None and not reason.startswith("needs torch")
]


def test_marked_blocks_say_why_and_are_listed():
    """Each block marked not-runnable gives its reason; the test report's warnings summary lists them all."""
    assert len(MARKED) <= 3, "keep blocks that cannot run rare"
    for page, line, reason in MARKED:
        assert len(reason.split()) >= 3, f"{page.name}:{line}: say why the block cannot run here"
        warnings.warn(f"{page.name}:{line} is not run: {reason}", UserWarning, stacklevel=1)


@pytest.mark.slow
def test_sphinx_builds_without_warnings(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(DOCS), str(tmp_path / "html")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
