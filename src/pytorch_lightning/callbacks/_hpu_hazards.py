"""What slows a training step down on Gaudi, where in the user's code it comes from, and the one-line fix."""

import linecache
import os
import re
import sysconfig
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Optional

import lightning
import torch

import pytorch_lightning

HOST_SYNC, RECOMPILATION, CPU_FALLBACK = "host sync", "recompilation", "CPU fallback"
# a frame in one of these is not the user's: the first frame outside them is the line to name
_LIBRARIES = tuple(os.path.dirname(module.__file__) + os.sep for module in (torch, lightning, pytorch_lightning)) + (
    sysconfig.get_paths()["stdlib"] + os.sep,
)
_VIRTUAL_GAUDI = ("virtual_hpu" + os.sep, "habana_frameworks" + os.sep)
# where Lightning reads logged values for the progress bar, the loggers and callback metrics
_LIGHTNING_LOGGING = ("logger_connector", "progress", "apply_func", "loggers", "result.py")
_RESUMED = re.compile(r"^torch_dynamo_resume_in_(\w+?)_at_\d+$")
_LIGHTNING = tuple(os.path.dirname(module.__file__) + os.sep for module in (lightning, pytorch_lightning))


@dataclass
class Hazard:
    """One cause of slow steps: its kind, where it comes from, how often, and the fix."""

    kind: str
    where: str  # "train.py:41 in training_step", or the Lightning function that caused it
    code: str  # the source line
    fix: str
    count: int = 0
    steps: list = field(default_factory=list)  # the first training steps (0-based, over the fit) it happened in
    details: list = field(default_factory=list)  # e.g. the shapes before and after a recompilation

    def record(self, step: int, detail: Optional[str] = None) -> None:
        self.count += 1
        if len(self.steps) < 5 and step not in self.steps:
            self.steps.append(step)
        if detail and detail not in self.details and len(self.details) < 3:
            self.details.append(detail)


def host_sync_hazard(frame: Optional[FrameType]) -> Hazard:
    """The hazard of a host sync whose innermost Python frame is ``frame``: the user's line, or Lightning's."""
    while frame is not None and _is_library(frame.f_code.co_filename, lightning_too=False):
        frame = frame.f_back
    if frame is None:
        return Hazard(HOST_SYNC, "outside Python code", "", "keep values on the device inside the training step")
    where, code = _describe(frame)
    if frame.f_code.co_filename.startswith(_LIGHTNING):
        if any(part in frame.f_code.co_filename for part in _LIGHTNING_LOGGING):
            fix = (
                "Lightning reads a value logged on every step (progress bar or logger): log it with `on_step=False`,"
                " or keep it off the progress bar"
            )
        else:
            fix = "a read inside Lightning or torch, not one of the usual hazards; please report it with this line"
        return Hazard(HOST_SYNC, f"Lightning, {where}", code, fix)
    return Hazard(HOST_SYNC, where, code, _host_sync_fix(code))


def function_where(function: Any) -> str:
    """``file:line in name`` of a function's definition."""
    code = getattr(function, "__code__", None)
    if code is None:
        return getattr(function, "__qualname__", "the training step")
    return f"{_short(code.co_filename)}:{code.co_firstlineno} in {function.__qualname__}"


def recompilation_hazard(where: str, before: str, after: str, last_batch: bool) -> Hazard:
    """A graph compiled again during training: the batch's shapes changed (the last one, or any), or shapes inside
    the step did."""
    if before != after and last_batch:
        fix = "the last batch is smaller than the others: `DataLoader(..., drop_last=True)`, or pad it to full size"
    elif before != after:
        fix = "input shapes change from step to step: pad them to a few fixed sizes (buckets), each compiled once"
    else:
        fix = "a shape inside the step depends on the data (masks, `nonzero`, `unique`): keep shapes static"
    return Hazard(RECOMPILATION, where, "", fix)


def batch_signature(batch: object) -> str:
    """The shapes and dtypes of a batch's tensors, e.g. ``(64, 1, 8, 8) float32, (64,) int64``."""
    tensors: list = []
    _collect(batch, tensors)
    return ", ".join(f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}" for t in tensors) or "no tensors"


def _collect(value: object, tensors: list) -> None:
    if isinstance(value, torch.Tensor):
        tensors.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _collect(item, tensors)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect(item, tensors)


def _is_library(filename: str, lightning_too: bool) -> bool:
    if any(part in filename for part in _VIRTUAL_GAUDI):
        return True
    if filename.startswith(_LIGHTNING):
        return lightning_too
    return filename.startswith(_LIBRARIES) or filename.startswith("<")


def short_source(source: str) -> str:
    """``file:line in function`` with the file relative to the working folder, as the other hazards name theirs."""
    location, _, function = source.partition(" in ")
    filename, _, line = location.rpartition(":")
    return f"{_short(filename)}:{line} in {function}"


def _describe(frame: FrameType) -> tuple[str, str]:
    filename, line = frame.f_code.co_filename, frame.f_lineno
    # after a graph break, torch.compile runs the rest of a function as a function of its own
    function = _RESUMED.sub(r"\1", frame.f_code.co_name)
    return f"{_short(filename)}:{line} in {function}", linecache.getline(filename, line).strip()


def _short(filename: str) -> str:
    if filename.startswith(_LIGHTNING):
        return filename.rsplit("site-packages" + os.sep)[-1]
    if filename.startswith("<"):
        return filename
    relative = os.path.relpath(filename)
    return filename if relative.startswith("..") else relative


def _host_sync_fix(code: str) -> str:
    if ".item()" in code:
        return "keep the value a tensor (`self.log(name, tensor)` takes tensors); read it on the host rarely, if at all"
    if "print(" in code:
        return "print outside the training step, or every N steps (`if batch_idx % 100 == 0:`)"
    if code.startswith(("if ", "elif ", "while ")) or " if " in code:
        return "keep the decision on the device: `torch.where(condition, a, b)` instead of a Python `if` on a tensor"
    if any(call in code for call in (".cpu()", ".tolist()", ".numpy()", ".to('cpu')", '.to("cpu")')):
        return "collect the tensors on the device and move them to the host once, at the end of the epoch"
    return "this line reads a device value on the host: keep it on the device, or read it less often"
