"""``fp8_autocast`` and the delayed-scaling state each Transformer Engine module keeps for its fp8 tensors."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from habana_frameworks.torch.hpex.experimental.transformer_engine.recipe import DelayedScaling

# what each format is on the device: Gaudi2's e4m3 has torch's float8_e4m3fnuz range, Gaudi3's is float8_e4m3fn
_DTYPES = {
    "GAUDI2": {"E4M3": torch.float8_e4m3fnuz, "E5M2": torch.float8_e5m2},
    "GAUDI3": {"E4M3": torch.float8_e4m3fn, "E5M2": torch.float8_e5m2},
}


@dataclass
class _Autocast:
    enabled: bool = False
    recipe: Optional[DelayedScaling] = None
    group: Optional[Any] = None
    force_measurement: Optional[bool] = None
    depth: int = 0  # nested fp8_autocast blocks
    first_module: bool = False  # no module has yet asked is_first_fp8_module() in the outermost block


_state = _Autocast()


def is_fp8_enabled() -> bool:
    """Whether the code runs inside ``fp8_autocast(enabled=True)``."""
    return _state.enabled


def get_fp8_recipe() -> DelayedScaling:
    return _state.recipe or DelayedScaling()


def get_fp8_group() -> Optional[Any]:
    return _state.group


def is_fp8_available() -> tuple[bool, str]:
    """Whether the device runs fp8, and why not."""
    import virtual_hpu

    generation = virtual_hpu.config().generation
    if generation not in _DTYPES:
        return False, f"fp8 is not supported on {generation}: it needs Gaudi2 or newer."
    return True, ""


class FP8GlobalStateManager:
    """The fp8 autocast state as Intel's Transformer Engine exposes it, for code that asks it rather than this
    module's functions; both read the same state. Outside ``fp8_autocast`` the recipe is ``None``."""

    @classmethod
    def is_fp8_available(cls) -> tuple[bool, str]:
        return is_fp8_available()

    @classmethod
    def is_fp8_enabled(cls) -> bool:
        return _state.enabled

    @classmethod
    def get_fp8_recipe(cls) -> Optional[DelayedScaling]:
        return _state.recipe

    @classmethod
    def get_fp8_group(cls) -> Optional[Any]:
        return _state.group

    @classmethod
    def get_manual_measurement_mode(cls) -> Optional[bool]:
        """``force_measurement`` of the outermost ``fp8_autocast``: ``None`` lets the recipe decide."""
        return _state.force_measurement

    @classmethod
    def set_measurement_mode(cls, manual: bool, manual_value: bool = True) -> None:
        _state.force_measurement = manual_value if manual else None

    @classmethod
    def is_first_fp8_module(cls) -> bool:
        """True for the first caller within the outermost ``fp8_autocast`` block, False afterwards."""
        first, _state.first_module = _state.first_module, False
        return first

    @classmethod
    def get_fp8_autocast_state(cls) -> tuple[bool, Optional[DelayedScaling], Optional[Any], bool]:
        return _state.enabled, _state.recipe, _state.group, _state.first_module

    @classmethod
    def set_fp8_autocast_state(cls, state: tuple[bool, Optional[DelayedScaling], Optional[Any], bool]) -> None:
        _state.enabled, _state.recipe, _state.group, _state.first_module = state

    @classmethod
    def fp8_autocast_enter(
        cls,
        enabled: bool = False,
        force_measurement: Optional[bool] = None,
        fp8_recipe: Optional[DelayedScaling] = None,
        fp8_group: Optional[Any] = None,
    ) -> None:
        if enabled:
            fp8_dtype("E4M3")  # refuses on first-generation Gaudi
        if fp8_recipe is not None and not isinstance(fp8_recipe, DelayedScaling):
            raise TypeError(f"fp8_recipe must be a recipe.DelayedScaling, got {type(fp8_recipe).__name__}")
        _state.enabled, _state.recipe, _state.group = enabled, fp8_recipe or DelayedScaling(), fp8_group
        if _state.depth == 0:
            _state.first_module, _state.force_measurement = True, force_measurement
        _state.depth += 1

    @classmethod
    def fp8_autocast_exit(cls) -> None:
        _state.depth -= 1


@contextmanager
def fp8_autocast(
    enabled: bool = False,
    force_measurement: Optional[bool] = None,
    fp8_recipe: Optional[DelayedScaling] = None,
    fp8_group: Optional[Any] = None,
) -> Iterator[None]:
    """Run Transformer Engine modules in fp8 within the block, scaled as ``fp8_recipe`` says (default
    ``DelayedScaling()``); amax is reduced over ``fp8_group`` (default: all ranks) when the recipe asks."""
    saved = _state.__dict__.copy()
    FP8GlobalStateManager.fp8_autocast_enter(enabled, force_measurement, fp8_recipe, fp8_group)
    try:
        yield
    finally:
        _state.__dict__.update(saved)


def fp8_dtype(kind: str) -> torch.dtype:
    """The torch dtype that holds fp8 ``kind`` ("E4M3" or "E5M2") on the current device."""
    import virtual_hpu

    generation = virtual_hpu.config().generation
    if generation not in _DTYPES:
        raise RuntimeError(f"fp8 is not supported on {generation}: it needs Gaudi2 or newer.")
    return _DTYPES[generation][kind]


def fp8_max(kind: str) -> float:
    return torch.finfo(fp8_dtype(kind)).max


class ScalingState:
    """Scales and amax history of ``count`` fp8 tensors, updated from the amax of earlier steps (delayed scaling).

    ``amax_history[0]`` collects the amax of the current step; at the next update it is reduced across ranks if the
    recipe asks, the history rolls, and every ``interval`` updates the scales are recomputed from it. The state is all
    tensors, updated in place without host syncs, so ``torch.compile`` traces it into the step's graph.
    """

    def __init__(self, count: int, device: torch.device) -> None:
        self.scale = torch.ones(count, device=device)
        self.scale_inv = torch.ones(count, device=device)
        self.amax_history = torch.zeros(1, count, device=device)
        self.steps = torch.zeros((), dtype=torch.int64, device=device)
        self.pending = torch.zeros((), dtype=torch.bool, device=device)  # amaxes recorded since the last update

    def record(self, index: int, amax: torch.Tensor) -> None:
        """Take ``amax`` into the current step's amax of tensor ``index``."""
        record_amax(self.amax_history, index, amax)
        self.pending.fill_(True)

    def update(self, recipe: DelayedScaling, kinds: list[str], group: Optional[Any]) -> None:
        """Close the step whose amaxes were recorded: reduce, roll the history, rescale every ``interval`` steps."""
        if self.amax_history.shape[0] != recipe.amax_history_len:
            self._fit_history(recipe.amax_history_len)
        if recipe.reduce_amax and dist.is_available() and dist.is_initialized():
            dist.all_reduce(self.amax_history[0], op=dist.ReduceOp.MAX, group=group)
        # without a recorded step nothing changes; selecting instead of branching keeps the host out of it
        steps = self.steps + self.pending.long()
        amax = self._amax(recipe)
        maxima = torch.tensor([fp8_max(kind) for kind in kinds], device=amax.device)
        # the largest power of two that maps amax into range, less the margin; keep the scale without data
        exponent = torch.floor(torch.log2(maxima / amax)) - recipe.margin
        rescale = self.pending & (steps % recipe.interval == 0) & (amax > 0) & torch.isfinite(amax)
        scale = torch.where(rescale, torch.exp2(exponent), self.scale)
        self.scale.copy_(scale)
        self.scale_inv.copy_(1.0 / scale)
        # rows are newest first: the closed step moves to row 1 and row 0 starts collecting again
        rolled = torch.roll(self.amax_history, 1, dims=0)
        rolled[0] = 0
        self.amax_history.copy_(torch.where(self.pending, rolled, self.amax_history))
        self.steps.copy_(steps)
        self.pending.fill_(False)

    def _amax(self, recipe: DelayedScaling) -> torch.Tensor:
        if callable(recipe.amax_compute_algo):
            return recipe.amax_compute_algo(self.amax_history)
        if recipe.amax_compute_algo == "max":
            return self.amax_history.amax(dim=0)
        return self.amax_history[0]

    # outside compiled graphs: the backward records into the history, which must be a graph input, not made in one
    @torch.compiler.disable
    def _fit_history(self, length: int) -> None:
        rows = self.amax_history.shape[0]
        if rows < length:
            padding = self.amax_history.new_zeros(length - rows, self.amax_history.shape[1])
            self.amax_history = torch.cat([self.amax_history, padding])
        elif rows > length:
            self.amax_history = self.amax_history[:length].clone()

    def to(self, device: torch.device) -> None:
        """Move the state to ``device`` (where the module's parameters went)."""
        for name in ("scale", "scale_inv", "amax_history", "steps", "pending"):
            setattr(self, name, getattr(self, name).to(device))

    def state_dict(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "scale_inv": self.scale_inv,
            "amax_history": self.amax_history,
            "steps": self.steps.detach().to("cpu", copy=True),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        device = self.scale.device
        self.scale = state["scale"].to(device, torch.float32).clone()
        self.scale_inv = state["scale_inv"].to(device, torch.float32).clone()
        self.amax_history = state["amax_history"].to(device, torch.float32).clone()
        self.steps = torch.as_tensor(state["steps"], dtype=torch.int64).to(device).clone()
        self.pending = self.amax_history[0].any()


def record_amax(amax_history: torch.Tensor, index: int, amax: torch.Tensor) -> None:
    """Raise the current step's amax of tensor ``index`` to ``amax`` if that is larger."""
    current = amax_history[0, index]
    current.copy_(torch.maximum(current, amax.detach().float()))
