"""The ``"hpu_backend"`` compile backend, registered with dynamo on import as the bridge does."""

from habana_frameworks.torch.dynamo.compile_backend import backends  # noqa: F401
