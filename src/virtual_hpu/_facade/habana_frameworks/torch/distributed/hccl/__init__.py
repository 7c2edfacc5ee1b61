"""``habana_frameworks.torch.distributed.hccl``: importing it (``habana_frameworks.torch`` does) registers the
``"hccl"`` c10d backend and runs ``initialize_distributed_hpu()``, as the bridge's module does (1.19 to 1.24): a
process torchrun did not start gets ``MASTER_ADDR=localhost`` and ``MASTER_PORT=12345``, and one mpirun started gets
its ranks from Open MPI's variables.

On the virtual Gaudi the backend is gloo working on the memory of the hpu tensors (see ``virtual_hpu.hccl``).
"""

from virtual_hpu.hccl import initialize_distributed_hpu, register

__all__ = ["initialize_distributed_hpu"]

register()
initialize_distributed_hpu()
