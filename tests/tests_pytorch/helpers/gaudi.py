"""Facts about Gaudi that tests check our code against."""

# the keys of ``habana_frameworks.torch.hpu.memory_stats()``
GAUDI_MEMORY_KEYS = (
    "Limit",
    "InUse",
    "MaxInUse",
    "NumAllocs",
    "NumFrees",
    "ActiveAllocs",
    "MaxAllocSize",
    "TotalSystemAllocs",
    "TotalSystemFrees",
    "TotalActiveAllocs",
)
