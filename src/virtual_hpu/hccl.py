"""The ``"hccl"`` c10d backend of the virtual Gaudi: gloo, working on the memory of the hpu tensors.

``register()`` (run by importing ``habana_frameworks.torch.distributed.hccl``) registers ``"hccl"`` with
``torch.distributed`` for the device ``hpu``, as the bridge does; every process group created with it is a gloo
backend.
Collectives on hpu tensors reach it through the device's C++ kernels for the ``c10d`` ops
(``csrc/collectives.cpp``): gloo reads and writes CPU aliases of the hpu memory, nothing is copied, and the futures
of the returned works complete with the hpu tensors themselves, as ``DistributedDataParallel`` expects.

As on HCCL, collectives on hpu tensors reduce with ``SUM``, ``MIN`` and ``MAX`` only (a mean is a sum divided by the
world size); other reduce ops raise. 64-bit integers, which HCCL handles with limits, simply work. So FSDP2
(``fully_shard``), which averages gradients with ``AVG``, needs ``set_force_sum_reduction_for_comms(True)`` on each of
its FSDP modules, and a DTensor ``mean`` over a sharded dimension raises, as Gaudi documents for DTensor.
Groups split from a group bound to a device (those of an ``init_device_mesh`` with more than one dimension) are gloo
backends too.
As on Gaudi, collectives on CPU tensors need a group of another backend (``new_group(backend="gloo")``); object
collectives (``all_gather_object`` and friends) move their bytes through the current HPU. Gloo's own threads then
release only tensors made in C++ (the CPU aliases): before torch 2.8 a group destroyed while such a thread still
released a tensor that Python had made waited on it forever (pytorch#154976).
"""

import os
from datetime import timedelta
from typing import Any, Optional

import torch.distributed as dist

from virtual_hpu import torch_support

__all__ = ["BACKEND", "initialize_distributed_hpu", "register"]

BACKEND = "hccl"


def register() -> None:
    """Register the ``"hccl"`` backend with ``torch.distributed``; later calls do nothing."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create_backend, extended_api=True, devices=["hpu"])
    default_backends = dist.Backend.default_device_backend_map
    if torch_support.installed() < torch_support.BACKEND_TAKES_DEVICES_FROM_FAKE and default_backends["hpu"] == "fake":
        # torch's fake process group, imported with FSDP, claimed hpu first: a group without a backend name must be HCCL
        default_backends["hpu"] = BACKEND
    if not hasattr(dist.ProcessGroupGloo, "perform_nocolor_split"):
        # With a group bound to a device (``init_process_group(device_id=...)``, as Lightning does), ``new_group``
        # has the ranks left out of the new group take part in a split of the bound device's backend; gloo
        # reports that it supports splitting but, unlike NCCL, has no such step, so there is nothing to take part in.
        dist.ProcessGroupGloo.perform_nocolor_split = _no_split
    if not hasattr(dist.ProcessGroupGloo._Options, "__deepcopy__"):
        # ``split_group`` (how ``init_device_mesh`` makes the groups of a mesh with more than one dimension when the
        # default group is bound to a device) starts from a deep copy of the parent backend's options, which gloo's
        # cannot make.
        dist.ProcessGroupGloo._Options.__deepcopy__ = _copy_options


def _no_split(backend: "dist.ProcessGroupGloo", device: Any) -> None:
    """Gloo's part in a split that does not include this rank: none."""


def _copy_options(options: Any, memo: dict) -> Any:
    """A copy of gloo's backend options, for a group split from a group of the ``"hccl"`` backend."""
    copy = type(options)()
    copy._timeout, copy._threads, copy._devices = options._timeout, options._threads, options._devices
    copy.global_ranks_in_group, copy.group_name = list(options.global_ranks_in_group), options.group_name
    return copy


def _create_backend(options: Any, backend_options: Any = None) -> "dist.ProcessGroupGloo":
    """A gloo backend for one process group (``backend_options``, HCCL's own options, have nothing to set here)."""
    timeout = options.timeout if isinstance(options.timeout, timedelta) else timedelta(minutes=30)
    backend = dist.ProcessGroupGloo(options.store, options.group_rank, options.group_size, timeout)
    if torch_support.gloo_options_name_their_group(backend.options):  # for a group split from this one
        backend.options.global_ranks_in_group = options.global_ranks_in_group
        backend.options.group_name = options.group_id
    backend._set_sequence_number_for_group()
    return backend


def initialize_distributed_hpu(
    world_size: Optional[int] = None, rank: Optional[int] = None, local_rank: Optional[int] = None
) -> tuple[int, int, int]:
    """Read the distributed configuration of this process as ``(world_size, rank, local_rank)``.

    Given all three values, they are written to ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` first. Otherwise the
    values come from those variables, or from Open MPI's ``OMPI_COMM_WORLD_{SIZE,RANK,LOCAL_RANK}`` (copied over when
    the former are not all set); ``MASTER_ADDR`` and ``MASTER_PORT`` default to ``localhost`` and ``12345``.
    Unset values read as world size 1 and ranks -1, as on Habana's stack. As there, a process of a run over several
    processes takes the card of its local rank (``HLS_MODULE_ID``, unless set), the local rank-th of
    ``HABANA_VISIBLE_MODULES`` when that is set, and fails with an ``AssertionError`` when it lists too few; ``ID``
    is the rank. As on Habana's stack, loading the bridge calls this once (its ``distributed.hccl`` module does when
    imported).
    """
    if world_size is not None and rank is not None and local_rank is not None:
        os.environ.update(WORLD_SIZE=str(world_size), RANK=str(rank), LOCAL_RANK=str(local_rank))
    else:
        _environment_from_mpi()
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", -1))
    local_rank = int(os.environ.get("LOCAL_RANK", -1))
    if local_rank != -1 and world_size != 1:
        _take_module(local_rank)
    if rank != -1:
        os.environ["ID"] = str(rank)
    return world_size, rank, local_rank


def _take_module(local_rank: int) -> None:
    """The card of this local rank, as Habana's stack picks it (a module id set already is kept)."""
    if "HLS_MODULE_ID" in os.environ:
        return
    visible = os.environ.get("HABANA_VISIBLE_MODULES")
    if visible is None:
        os.environ["HLS_MODULE_ID"] = str(local_rank)
        return
    modules = visible.split(",")
    # Habana's words and exception type, which launch scripts may look for
    assert local_rank < len(modules), (
        "There is not enough devices available for training. Please verify if HABANA_VISIBLE_MODULES is set correctly."
    )
    os.environ["HLS_MODULE_ID"] = modules[local_rank]


_MPI_VARIABLES = {
    "OMPI_COMM_WORLD_SIZE": "WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK": "RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK": "LOCAL_RANK",
}


def _environment_from_mpi() -> None:
    if all(name in os.environ for name in _MPI_VARIABLES.values()):
        return
    if all(name in os.environ for name in _MPI_VARIABLES):
        for mpi_name, name in _MPI_VARIABLES.items():
            os.environ[name] = os.environ[mpi_name]
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "12345")
