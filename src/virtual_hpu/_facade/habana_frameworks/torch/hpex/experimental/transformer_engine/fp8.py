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


_state = _Autocast()


def is_fp8_enabled() -> bool:
    """Whether the code runs inside ``fp8_autocast(enabled=True)``."""
    return _state.enabled


def get_fp8_recipe() -> DelayedScaling:
    return _state.recipe or DelayedScaling()


def get_fp8_group() -> Optional[Any]:
    return _state.group


@contextmanager
def fp8_autocast(
    enabled: bool = False,
    force_measurement: Optional[bool] = None,
    fp8_recipe: Optional[DelayedScaling] = None,
    fp8_group: Optional[Any] = None,
) -> Iterator[None]:
    """Run Transformer Engine modules in fp8 within the block, scaled as ``fp8_recipe`` says (default
    ``DelayedScaling()``); amax is reduced over ``fp8_group`` (default: all ranks) when the recipe asks."""
    if enabled:
        fp8_dtype("E4M3")  # refuses on first-generation Gaudi
    if fp8_recipe is not None and not isinstance(fp8_recipe, DelayedScaling):
        raise TypeError(f"fp8_recipe must be a recipe.DelayedScaling, got {type(fp8_recipe).__name__}")
    saved = _state.__dict__.copy()
    _state.__dict__.update(
        enabled=enabled, recipe=fp8_recipe or DelayedScaling(), group=fp8_group, force_measurement=force_measurement
    )
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
    recipe asks, the history rolls, and every ``interval`` updates the scales are recomputed from it.
    """

    def __init__(self, count: int, device: torch.device) -> None:
        self.scale = torch.ones(count, device=device)
        self.scale_inv = torch.ones(count, device=device)
        self.amax_history = torch.zeros(1, count, device=device)
        self.steps = 0
        self.pending = False

    def record(self, index: int, amax: torch.Tensor) -> None:
        """Take ``amax`` into the current step's amax of tensor ``index``."""
        current = self.amax_history[0, index]
        current.copy_(torch.maximum(current, amax.detach().float()))
        self.pending = True

    def update(self, recipe: DelayedScaling, kinds: list[str], group: Optional[Any]) -> None:
        """Close the step whose amaxes were recorded: reduce, roll the history, rescale every ``interval`` steps."""
        self._fit_history(recipe.amax_history_len)
        if not self.pending:
            return
        if recipe.reduce_amax and dist.is_available() and dist.is_initialized():
            dist.all_reduce(self.amax_history[0], op=dist.ReduceOp.MAX, group=group)
        self.steps += 1
        if self.steps % recipe.interval == 0:
            amax = self._amax(recipe)
            maxima = torch.tensor([fp8_max(kind) for kind in kinds], device=amax.device)
            # the largest power of two that maps amax into range, less the margin; keep the scale without data
            exponent = torch.floor(torch.log2(maxima / amax)) - recipe.margin
            scale = torch.where((amax > 0) & torch.isfinite(amax), torch.exp2(exponent), self.scale)
            self.scale.copy_(scale)
            self.scale_inv.copy_(1.0 / scale)
        # rows are newest first: the closed step moves to row 1 and row 0 starts collecting again
        self.amax_history.copy_(torch.roll(self.amax_history, 1, dims=0))
        self.amax_history[0].zero_()
        self.pending = False

    def _amax(self, recipe: DelayedScaling) -> torch.Tensor:
        if callable(recipe.amax_compute_algo):
            return recipe.amax_compute_algo(self.amax_history)
        if recipe.amax_compute_algo == "max":
            return self.amax_history.amax(dim=0)
        return self.amax_history[0]

    def _fit_history(self, length: int) -> None:
        rows = self.amax_history.shape[0]
        if rows < length:
            padding = self.amax_history.new_zeros(length - rows, self.amax_history.shape[1])
            self.amax_history = torch.cat([self.amax_history, padding])
        elif rows > length:
            self.amax_history = self.amax_history[:length].clone()

    def state_dict(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "scale_inv": self.scale_inv,
            "amax_history": self.amax_history,
            "steps": torch.tensor(self.steps),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = state["scale"].to(self.scale.device, torch.float32).clone()
        self.scale_inv = state["scale_inv"].to(self.scale.device, torch.float32).clone()
        self.amax_history = state["amax_history"].to(self.scale.device, torch.float32).clone()
        self.steps = int(state["steps"])
        self.pending = bool(self.amax_history[0].any())
