"""The knobs of the virtual Gaudi, read from ``activate()`` arguments or the environment, and validated."""

import os
from dataclasses import dataclass
from typing import Optional

MAX_DEVICES = 16
MAX_MEMORY_MB = 1024 * 1024
# HBM per device of each Gaudi generation, in MiB.
GENERATION_MEMORY_MB = {"GAUDI": 32768, "GAUDI2": 98304, "GAUDI3": 131072}
DEFAULT_DEVICES = 8
DEFAULT_GENERATION = "GAUDI2"
# the rehearsal of the hardware test tier: the device works as before, but says nothing of being virtual
AS_HARDWARE = "VIRTUAL_HPU_AS_HARDWARE"
# pose as a Gaudi image with stock (upstream) PyTorch, which Intel ships since Gaudi software 1.24, rather than Intel's
# own PyTorch build: the bridge loads as a plugin there and refuses lazy mode
STOCK_PYTORCH = "VIRTUAL_HPU_STOCK_PYTORCH"


@dataclass(frozen=True)
class Config:
    """What an activated virtual Gaudi looks like."""

    devices: int
    generation: str
    memory_mb: int
    lazy: bool
    stock_pytorch: bool = False

    @property
    def fp16_supported(self) -> bool:
        """First-generation Gaudi has neither fp16 nor fp8."""
        return self.generation != "GAUDI"

    @property
    def fp8_supported(self) -> bool:
        return self.generation != "GAUDI"


def _int_in_range(value: object, variable: str, low: int, high: int) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        number = None
    if number is None or isinstance(value, bool) or not low <= number <= high:
        raise ValueError(f"{variable} must be an integer in [{low}, {high}], got {value!r}")
    return number


def _visible(devices: int, modules: str) -> int:
    """How many of the node's ``devices`` this process sees: as on Gaudi, ``HABANA_VISIBLE_MODULES`` (module ids
    separated by commas, e.g. ``"0,1"``) limits them, for several jobs sharing a node."""
    if not modules.strip():
        return devices
    ids = [module.strip() for module in modules.split(",")]
    if any(not module.isdigit() or int(module) >= devices for module in ids) or len(set(ids)) != len(ids):
        raise ValueError(
            f"HABANA_VISIBLE_MODULES must list distinct module ids from 0 to {devices - 1} separated by commas"
            f" (e.g. '0,1'), got {modules!r}"
        )
    return len(ids)


def resolve(devices: Optional[int] = None, generation: Optional[str] = None, memory_mb: Optional[int] = None) -> Config:
    """Combine explicit arguments (first) with ``VIRTUAL_HPU_*`` variables and defaults; raise ``ValueError``."""
    env = os.environ
    devices = _int_in_range(
        devices if devices is not None else env.get("VIRTUAL_HPU_DEVICES", DEFAULT_DEVICES),
        "VIRTUAL_HPU_DEVICES",
        1,
        MAX_DEVICES,
    )
    devices = _visible(devices, env.get("HABANA_VISIBLE_MODULES", ""))
    raw_generation = generation if generation is not None else env.get("VIRTUAL_HPU_GENERATION", DEFAULT_GENERATION)
    generation = str(raw_generation).strip().upper()
    if generation not in GENERATION_MEMORY_MB:
        raise ValueError(
            f"VIRTUAL_HPU_GENERATION must be one of {', '.join(GENERATION_MEMORY_MB)}, got {raw_generation!r}"
        )
    memory_mb = _int_in_range(
        memory_mb if memory_mb is not None else env.get("VIRTUAL_HPU_MEMORY_MB", GENERATION_MEMORY_MB[generation]),
        "VIRTUAL_HPU_MEMORY_MB",
        1,
        MAX_MEMORY_MB,
    )
    # Current Gaudi software runs eager (with torch.compile) unless lazy mode, the legacy path, is asked for.
    lazy = env.get("PT_HPU_LAZY_MODE", "0").strip()
    if lazy not in ("0", "1"):
        raise ValueError(f"PT_HPU_LAZY_MODE must be 0 (eager) or 1 (lazy), got {lazy!r}")
    stock_pytorch = env.get(STOCK_PYTORCH, "").strip()
    if stock_pytorch not in ("", "0", "1"):
        raise ValueError(f"{STOCK_PYTORCH} must be 1 (an image with stock PyTorch) or 0, got {stock_pytorch!r}")
    return Config(devices, generation, memory_mb, lazy=lazy == "1", stock_pytorch=stock_pytorch == "1")


def as_hardware() -> bool:
    """Whether the virtual Gaudi poses as real hardware (``VIRTUAL_HPU_AS_HARDWARE=1``): it hides what Intel's bridge
    does not expose (that it is virtual, its accounting and events), so that a run shows what needs none of it."""
    flag = os.environ.get(AS_HARDWARE, "").strip()
    if flag not in ("", "0", "1"):
        raise ValueError(f"{AS_HARDWARE} must be 1 (pose as hardware) or 0, got {flag!r}")
    return flag == "1"


def refuse_as_hardware(what: str) -> None:
    """Raise for ``what``, a part of the virtual Gaudi real hardware does not have, while it poses as hardware."""
    if as_hardware():
        raise RuntimeError(
            f"{what} is the virtual Gaudi's own and real Gaudi hardware has none; {AS_HARDWARE}=1 hides it. A test that"
            " reads it belongs to the virtual tier: mark it `RunIf(virtual_hpu=True)`."
        )
