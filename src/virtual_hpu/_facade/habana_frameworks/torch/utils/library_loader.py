"""Whether the Gaudi libraries can be used."""


def is_habana_available() -> bool:
    import torch

    return torch.hpu.is_available()


def load_habana_module() -> None:
    """The real stack loads its libraries here; the virtual one did so at activation."""
