"""Random numbers on the virtual devices.

HPU tensors draw from torch's CPU generator, so a seeded run gives the same numbers on ``hpu`` as on ``cpu``;
every device index therefore shares that one generator.

A Gaudi also has a counter-based ("philox") generator, whose state is a seed and an offset; DTensor's random-number
tracking selects it with ``set_rng_ctx("philox")`` and moves the offset to give each shard its own numbers. Here,
inside that context, the state read and written is such a (seed, offset) pair, and setting it reseeds the shared
generator from the pair, so the same seed and offset draw the same numbers on every rank.
"""

from collections.abc import Iterable
from typing import Any

import torch

_PHILOX = "philox"
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # an odd constant spreading consecutive offsets over the seed space


class _SharedGenerators:
    """``default_generators[i]``: the CPU default generator for every valid device index."""

    def __getitem__(self, index: int) -> torch.Generator:
        if not 0 <= index < len(self):
            raise IndexError(f"hpu:{index} does not exist")
        return torch.default_generator

    def __len__(self) -> int:
        return torch.ops.virtual_hpu.device_count()

    def __iter__(self):
        return (self[i] for i in range(len(self)))


default_generators = _SharedGenerators()


class _Philox:
    """The (seed, offset) of the counter-based generator, and how deep ``set_rng_ctx("philox")`` calls are nested."""

    def __init__(self) -> None:
        self.seed: int | None = None  # the shared generator's initial seed until seeded
        self.offset = 0
        self.depth = 0

    def state(self) -> torch.Tensor:
        seed = torch.default_generator.initial_seed() if self.seed is None else self.seed
        signed = seed - (1 << 64) if seed >= 1 << 63 else seed  # the same 8 bytes as the unsigned seed
        return torch.tensor([signed, self.offset], dtype=torch.int64).view(torch.uint8)

    def set_state(self, state: torch.Tensor) -> None:
        if state.numel() != 16 or state.dtype != torch.uint8:
            raise ValueError(
                f"The philox generator's state is 16 bytes (seed, offset), got {state.numel()} of {state.dtype};"
                " pass a state read with get_rng_state() inside set_rng_ctx('philox')."
            )
        seed, offset = state.cpu().contiguous().view(torch.int64).tolist()
        self.seed, self.offset = seed & _MASK64, offset
        torch.default_generator.manual_seed((self.seed ^ (offset * _GOLDEN)) & _MASK64)


_philox = _Philox()


def set_rng_ctx(name: str) -> None:
    """Make ``get_rng_state`` / ``set_rng_state`` read and write the ``"philox"`` generator until ``unset_rng_ctx``."""
    if name != _PHILOX:
        raise ValueError(f"Unknown random-number context {name!r}; the HPU has '{_PHILOX}'.")
    _philox.depth += 1


def unset_rng_ctx(name: str) -> None:
    if name != _PHILOX:
        raise ValueError(f"Unknown random-number context {name!r}; the HPU has '{_PHILOX}'.")
    if _philox.depth == 0:
        raise RuntimeError("unset_rng_ctx('philox') without a matching set_rng_ctx('philox').")
    _philox.depth -= 1


def get_rng_state(device: Any = "hpu") -> torch.Tensor:
    return _philox.state() if _philox.depth else torch.default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "hpu") -> None:
    if _philox.depth:
        _philox.set_state(new_state)
    else:
        torch.default_generator.set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(len(default_generators))]


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


def manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))
    _philox.seed, _philox.offset = None, 0  # the philox seed follows the shared generator's again


manual_seed_all = manual_seed


def seed() -> None:
    torch.default_generator.seed()


seed_all = seed


def initial_seed() -> int:
    return torch.default_generator.initial_seed()
