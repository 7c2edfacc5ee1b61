"""``habana_frameworks.torch.utils``."""

from habana_frameworks.torch.utils import experimental, internal, library_loader  # noqa: F401
