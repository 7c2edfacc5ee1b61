"""fp8 recipes: which fp8 formats to use and how scaling factors follow the observed magnitudes (amax)."""

from dataclasses import dataclass
from enum import Enum
from typing import Callable, Union

import torch


class Format(Enum):
    """The fp8 formats of the forward pass (activations, weights) and of the backward pass (gradients).

    E4M3 has more precision, E5M2 more range; HYBRID uses E4M3 forward and E5M2 backward.
    """

    E4M3 = ("E4M3", "E4M3")
    E5M2 = ("E5M2", "E5M2")
    HYBRID = ("E4M3", "E5M2")

    @property
    def forward(self) -> str:
        return self.value[0]

    @property
    def backward(self) -> str:
        return self.value[1]


AmaxComputeAlgo = Union[str, Callable[[torch.Tensor], torch.Tensor]]


@dataclass
class DelayedScaling:
    """Scaling from the amax of earlier steps: every ``interval`` steps the scale of each tensor becomes the largest
    power of two that maps the amax (the most recent one, or the maximum over ``amax_history_len`` steps) into the
    fp8 range, divided by ``2**margin``. With ``reduce_amax`` the amax is reduced over the ``fp8_group`` first."""

    margin: int = 0
    interval: int = 1
    fp8_format: Format = Format.E5M2
    amax_history_len: int = 1
    amax_compute_algo: AmaxComputeAlgo = "most_recent"
    reduce_amax: bool = True

    def __post_init__(self) -> None:
        assert self.fp8_format != Format.E4M3, "Pure E4M3 training is not supported."
        assert isinstance(self.fp8_format, Format), f"fp8_format must be a recipe.Format, got {self.fp8_format!r}"
        assert self.interval >= 1, f"interval must be at least 1, got {self.interval}"
        assert self.amax_history_len >= 1, f"amax_history_len must be at least 1, got {self.amax_history_len}"
        assert self.margin >= 0, f"margin must be non-negative, got {self.margin}"
        assert callable(self.amax_compute_algo) or self.amax_compute_algo in ("max", "most_recent"), (
            f"amax_compute_algo must be 'max', 'most_recent' or a callable, got {self.amax_compute_algo!r}"
        )
