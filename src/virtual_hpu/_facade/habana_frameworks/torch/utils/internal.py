"""Internal helpers some integrations (DeepSpeed) read."""

from habana_frameworks.torch.core import is_lazy  # noqa: F401
