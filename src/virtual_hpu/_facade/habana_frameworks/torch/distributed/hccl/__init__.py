"""``habana_frameworks.torch.distributed.hccl``: importing it registers the ``"hccl"`` c10d backend.

On the virtual Gaudi the backend is gloo working on the memory of the hpu tensors (see ``virtual_hpu.hccl``).
"""

from virtual_hpu.hccl import initialize_distributed_hpu, register

__all__ = ["initialize_distributed_hpu"]

register()
