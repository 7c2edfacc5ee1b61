"""Random numbers on the virtual devices.

HPU tensors draw from torch's CPU generator, so a seeded run gives the same numbers on ``hpu`` as on ``cpu``;
every device index therefore shares that one generator.
"""

from typing import Any

import torch


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


def get_rng_state(device: Any = "hpu") -> torch.Tensor:
    return torch.default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "hpu") -> None:
    torch.default_generator.set_state(new_state)


def manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


manual_seed_all = manual_seed


def seed() -> None:
    torch.default_generator.seed()


seed_all = seed


def initial_seed() -> int:
    return torch.default_generator.initial_seed()
