"""What every HPU strategy, of Fabric and of the Trainer, does on top of its upstream base: Gaudi checkpoint I/O,
lazy-mode graph cuts, and (for the strategies that start one process per HPU) HCCL and indexed parallel devices. The
Trainer's strategies add their own concerns on top (``pytorch_lightning.strategies._hpu``)."""

import atexit
import copy
import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Callable, Optional, Union

import torch
import torch.distributed as dist
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.utilities.distributed import _destroy_dist_connection
from lightning.fabric.utilities.exceptions import MisconfigurationException
from torch import Tensor
from torch.distributed import ReduceOp

from lightning_fabric.accelerators.hpu import HPUAccelerator
from lightning_fabric.plugins.io.hpu import HPUCheckpointIO
from lightning_fabric.strategies._hpu_compile import FabricRecompilation, compile_submodules_for_hpu


class _HPUStrategyMixin:
    """Mixed into each HPU strategy, of Fabric and of the Trainer, before its upstream base class.

    In lazy mode Gaudi records operations into a graph that runs when ``mark_step()`` cuts it. We cut where a unit of
    device work ends: after backward and after the optimizer step, so graphs keep the same shape from step to step and
    are compiled once. In eager mode there is nothing to cut and we add no call. We never read a value back to the host
    here: that would force the pending graph to run mid-step. Fabric and the Trainer call ``backward`` and
    ``optimizer_step`` with different arguments; both pass through unchanged.
    """

    _accelerator: Any
    _checkpoint_io: Optional[CheckpointIO]
    _graph_cut: Optional[Callable[[], None]] = None

    @property
    def checkpoint_io(self) -> CheckpointIO:
        if self._checkpoint_io is None:
            self._checkpoint_io = HPUCheckpointIO()
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io: Optional[CheckpointIO]) -> None:
        self._checkpoint_io = io

    @property
    def accelerator(self) -> Any:
        return self._accelerator

    @accelerator.setter
    def accelerator(self, accelerator: Any) -> None:
        # upstream's connectors give the strategy its accelerator before anything is moved to a device (Fabric moves
        # modules before it sets the strategy up)
        if isinstance(accelerator, HPUAccelerator):
            accelerator.attach_hpu_strategy()
        self._accelerator = accelerator

    @classmethod
    def from_upstream(cls, strategy: Any) -> Any:
        """This strategy with every setting of an instance of its upstream base class, as a script moved from CUDA
        passes one (``DDPStrategy(find_unused_parameters=True)``, ``DeepSpeedStrategy(stage=3)``, ...); the instance
        itself is left as it is. Its devices become the HPUs of the same indices, CUDA's NCCL backend HCCL."""
        # what the HPU class adds to its upstream base comes from its own defaults, the rest from the user's instance
        hpu = cls(*cls._required_arguments(strategy))
        vars(hpu).update(copy.copy(vars(strategy)))
        root_device = vars(hpu).get("_root_device")
        if root_device is not None and root_device.type != "hpu":
            hpu._root_device = torch.device("hpu", root_device.index or 0)
        parallel_devices = vars(hpu).get("_parallel_devices")
        if parallel_devices:
            hpu.parallel_devices = [
                device if device.type == "hpu" else torch.device("hpu", device.index) for device in parallel_devices
            ]
        if vars(hpu).get("_process_group_backend") == "nccl":
            hpu._process_group_backend = None
        return hpu

    @classmethod
    def _required_arguments(cls, strategy: Any) -> tuple:
        """The arguments without a default that ``from_upstream`` must pass on to build this class: none for most."""
        return ()

    def _setup_hpu(self) -> None:
        """The first step of every HPU strategy's set-up, before the accelerator's ``setup_device``."""
        if isinstance(self.accelerator, HPUAccelerator):
            self.accelerator.attach_hpu_strategy()
        self._setup_graph_cuts()

    def _setup_graph_cuts(self) -> None:
        import habana_frameworks.torch.core as htcore

        self._graph_cut = htcore.mark_step if htcore.is_lazy() else None

    def _cut_graph(self) -> None:
        if self._graph_cut is not None:
            self._graph_cut()

    def setup_environment(self) -> None:
        self._setup_hpu()
        super().setup_environment()  # type: ignore[misc]

    def backward(self, tensor: Tensor, *args: Any, **kwargs: Any) -> Any:
        output = super().backward(tensor, *args, **kwargs)  # type: ignore[misc]
        self._cut_graph()
        return output

    def optimizer_step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        output = super().optimizer_step(optimizer, *args, **kwargs)  # type: ignore[misc]
        self._cut_graph()
        return output

    # Fabric's module set-up (the Trainer's strategies have none): a module compiled with torch's default backend is
    # compiled again for HPU when Fabric wraps it (see ``_hpu_compile``)
    def setup_module(self, module: Any) -> Any:
        module = FabricRecompilation.armed_around(super().setup_module, module)  # type: ignore[misc]
        compile_submodules_for_hpu(module)
        return module

    def setup_module_and_optimizers(self, module: Any, *args: Any, **kwargs: Any) -> Any:
        setup = super().setup_module_and_optimizers  # type: ignore[misc]
        module, *rest = FabricRecompilation.armed_around(setup, module, *args, **kwargs)
        compile_submodules_for_hpu(module)
        return (module, *rest)


class _HPUParallelDevicesMixin:
    """Mixed into each HPU strategy that runs one process per HPU, before its upstream base class: HCCL as the process
    group backend and for reductions, and indexed parallel devices.

    ``parallel_devices=[torch.device("hpu")] * n`` is the documented way to ask for ``n`` HPUs: a device without an
    index stands for the one at its position, the device of the process with that local rank. Indexed here, because
    the process group and DDP need the index of the device they run on.
    """

    _parallel_devices: Optional[list[torch.device]]
    process_group_backend: Optional[str]
    accelerator: Any
    root_device: torch.device

    def _get_process_group_backend(self) -> str:
        # upstream's default for a device other than CUDA is gloo
        return self.process_group_backend or "hccl"

    def _require_hpu_accelerator(self, upstream: str) -> None:
        """Refuse another accelerator before any work; ``upstream`` is the strategy to use on CUDA instead."""
        if not isinstance(self.accelerator, HPUAccelerator):
            raise MisconfigurationException(
                f"`{type(self).__name__}` trains on HPUs but `{type(self.accelerator).__name__}` is used. Pass"
                f" `accelerator='hpu'`, or use `{upstream}` for CUDA GPUs."
            )

    def reduce(
        self,
        tensor: Union[Tensor, Any],
        group: Optional[Any] = None,
        reduce_op: Optional[Union[ReduceOp, str]] = "mean",
    ) -> Union[Tensor, Any]:
        return hccl_reduce(tensor, group, reduce_op)

    # Fabric's name for the Trainer's ``reduce``
    all_reduce = reduce

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        # the process group is not bound to the HPU (see ``hccl_process_group``): name it, as upstream does for NCCL,
        # rather than have torch guess it (and warn)
        if dist.is_available() and dist.is_initialized():
            dist.barrier(device_ids=[self.root_device.index])

    @property
    def parallel_devices(self) -> Optional[list[torch.device]]:
        return self._parallel_devices

    @parallel_devices.setter
    def parallel_devices(self, devices: Optional[Sequence[Union[torch.device, str, int]]]) -> None:
        self._parallel_devices = None if devices is None else _indexed_hpu_devices(devices, type(self).__name__)


# HCCL reduces with these; a mean is a sum divided by the world size
_HCCL_REDUCE_OPS = {"sum": ReduceOp.SUM, "min": ReduceOp.MIN, "max": ReduceOp.MAX}
_MEAN_OPS = ("mean", "avg")


def hccl_reduce(
    tensor: Union[Tensor, Any], group: Optional[Any] = None, reduce_op: Optional[Union[ReduceOp, str]] = "mean"
) -> Union[Tensor, Any]:
    """Reduce ``tensor`` over all processes with the operations HCCL supports.

    A mean is a sum divided by the world size, and 64-bit integers travel as 32-bit floats, since HCCL has neither.
    """
    if not isinstance(tensor, Tensor) or not torch.distributed.is_initialized():
        return tensor
    op_name = "mean" if reduce_op is None else str(reduce_op).lower().rpartition(".")[2]
    if op_name not in _HCCL_REDUCE_OPS and op_name not in _MEAN_OPS:
        raise ValueError(
            f"`reduce_op={reduce_op!r}` is not supported on HPU. Choose one of 'mean', 'sum', 'min' or 'max'."
        )
    original_dtype = tensor.dtype
    as_float = op_name in _MEAN_OPS or original_dtype == torch.int64
    result = tensor.to(torch.float32) if as_float and not original_dtype.is_floating_point else tensor.clone()
    torch.distributed.all_reduce(result, op=_HCCL_REDUCE_OPS.get(op_name, ReduceOp.SUM), group=group)
    if op_name in _MEAN_OPS:
        result = result / torch.distributed.get_world_size(group)
        # like upstream, the mean of integers is a float
        return result.to(original_dtype) if original_dtype.is_floating_point else result
    return result.to(original_dtype)


def sum_fsdp2_gradients(module: torch.nn.Module, owner: str) -> None:
    """Have every FSDP2 unit in ``module`` reduce gradients with sums and divide after: HCCL has no average, which
    FSDP2 takes otherwise for fp32 and bf16 gradients. Called once the model is set up, before its first step."""
    from torch.distributed.fsdp import FSDPModule

    units = [submodule for submodule in module.modules() if isinstance(submodule, FSDPModule)]
    if units and not hasattr(FSDPModule, "set_force_sum_reduction_for_comms"):
        # the method came with pytorch#155915: in torch 2.9 (Gaudi software 1.23), not in 2.7.1 (1.22) or 2.6 (1.21)
        raise RuntimeError(
            f"`{owner}` shards the model with FSDP2 (`fully_shard`), which on HPUs requires PyTorch 2.9 or higher:"
            " HCCL cannot average, and only from 2.9 can FSDP2 be told to sum gradients instead. This is torch"
            f" {torch.__version__}. Use Gaudi software 1.23 or newer (torch 2.9+), or on this torch tensor parallelism"
            " without `fully_shard`, or FSDP1 (`strategy='fsdp'`)."
        )
    for unit in units:
        unit.set_force_sum_reduction_for_comms(True)


def _indexed_hpu_devices(devices: Sequence[Union[torch.device, str, int]], owner: str) -> list[torch.device]:
    """``devices`` as HPU devices with indices: a device without one is the HPU at its position in the list."""
    indexed = [torch.device("hpu", device) if isinstance(device, int) else torch.device(device) for device in devices]
    others = [str(device) for device in indexed if device.type != "hpu"]
    if others:
        raise ValueError(
            f"`{owner}(parallel_devices=[{', '.join(map(repr, map(str, indexed)))}])` has non-HPU devices {others}."
            " Pass HPU devices, e.g. `[torch.device('hpu')] * 2` or `[torch.device('hpu', i) for i in range(2)]`."
        )
    indexed = [
        torch.device("hpu", position) if device.index is None else device for position, device in enumerate(indexed)
    ]
    if len(set(indexed)) != len(indexed):
        raise ValueError(
            f"`{owner}(parallel_devices=[{', '.join(repr(str(device)) for device in indexed)}])` names an HPU more than"
            " once; each process needs its own. Pass distinct indices, or devices without an index."
        )
    return indexed


@contextmanager
def hccl_process_group() -> Iterator[None]:
    """Around upstream's set-up of the process group, in each HPU strategy that starts one process per HPU.

    Before it, HCCL is registered with ``torch.distributed`` (by importing the bridge's module). After it, a group this
    set-up created is left unbound, as Intel's examples and lightning-habana create it: Lightning binds the group to
    the rank's device (``init_process_group(device_id=...)``), and torch then asks every later group for a backend of
    that device. Gloo serves no HPU, so ``new_group(backend="gloo")`` fails (Lightning's own, around ``prepare_data``
    and in ``Fabric.rank_zero_first``, as libraries' CPU groups do), and ``DeviceMesh`` splits its groups from the
    bound one, which HCCL cannot. A group the user created is left as it is. Either way the group is destroyed when
    the interpreter exits.
    """
    # importing it registers the "hccl" backend with torch.distributed
    import habana_frameworks.torch.distributed.hccl  # noqa: F401

    created = not dist.is_initialized()
    with _unbound_where_torch_binds_cuda_only():
        yield
    if created and dist.is_initialized():
        dist.GroupMember.WORLD.bound_device_id = None  # type: ignore[union-attr]
    _destroy_process_group_at_exit()


@contextmanager
def _unbound_where_torch_binds_cuda_only() -> Iterator[None]:
    """Before torch 2.7 a group binds to a CUDA device only, and an HPU's ``device_id``, which upstream passes, is
    refused: there the group is created unbound, as it is left anyway."""
    from virtual_hpu import torch_support

    if torch_support.installed() >= torch_support.GROUPS_BIND_TO_ANY_ACCELERATOR:
        yield
        return
    init = dist.init_process_group

    def unbound(*args: Any, device_id: Any = None, **kwargs: Any) -> Any:
        return init(*args, **kwargs)

    dist.init_process_group = unbound
    try:
        yield
    finally:
        dist.init_process_group = init


def _destroy_process_group_at_exit() -> None:
    """Have the process group destroyed when the interpreter exits, while torch can still shut it down in order.

    Upstream does this for NCCL only. A group left to interpreter shutdown is torn down in no particular order, and its
    backend's threads can outlive the objects they use: processes then abort after the run ("terminate called without
    an active exception"). Kept alive until then, so that ``fit`` and ``test`` in one script share the group.
    """
    atexit.unregister(_end_process_group)
    atexit.register(_end_process_group)


def _end_process_group() -> None:
    """Destroy the process group, and free the reference cycles that still hold it (FSDP's wrapped modules can).

    Freed here, the group's backend stops its threads while the interpreter runs. Left to the collection at interpreter
    shutdown, a gloo thread that releases a finished collective's tensors needs the GIL, which it can no longer take,
    and the process aborts.
    """
    _destroy_dist_connection()
    gc.collect()


def single_hpu_device(device: Union[torch.device, str, int], owner: str) -> torch.device:
    """The device of a one-HPU strategy, which must be an HPU."""
    device = torch.device(device)
    if device.type != "hpu":
        raise ValueError(f"`{owner}(device={device!r})` needs an HPU device, e.g. 'hpu:0'.")
    return device


def hccl_ddp_names(parallel: str) -> tuple[tuple[str, str], ...]:
    """(name, start method) of the data-parallel HPU strategies; ``"hpu_ddp"`` is the name lightning-habana users
    know."""
    return ((parallel, "popen"), (f"{parallel}_spawn", "spawn"), ("hpu_ddp", "popen"))
