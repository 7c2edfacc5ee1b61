"""The torch versions this distribution supports, and the check that refuses others before anything is built.

Each Intel Gaudi release ships one torch, and its bridge refuses any other; laptops have newer ones. The range is every
torch from the oldest supported Gaudi release's to the newest release tested (``docs/source-pytorch/hpu_torch.rst``
lists them with how each is tested). The virtual Gaudi's C++ sources compile across it (``csrc/torch_compat.h``).
``requirements/base.txt`` names the range without pinning it: pip would replace a Gaudi image's own torch to satisfy a
pin, so the range is enforced here, where HPU is asked for.
"""

import re
from typing import TYPE_CHECKING, NamedTuple, Optional

if TYPE_CHECKING:
    import torch


class TorchRelease(NamedTuple):
    """A torch release's major and minor version."""

    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


OLDEST = TorchRelease(2, 6)  # Gaudi software 1.21, the last for first-generation Gaudi
NEWEST = TorchRelease(2, 15)  # PyPI's newest when the range was last extended
# 2.7: torch.profiler.ProfilerActivity gained HPU (pytorch#148182)
PROFILER_HAS_HPU_ACTIVITY = TorchRelease(2, 7)
# 2.7: torch.accelerator.current_accelerator() names the accelerator torch was built for, or None (pytorch#144368,
# pytorch#146443); before, the one with a device available, and it raises where there is none
ACCELERATOR_IS_THE_BUILDS = TorchRelease(2, 7)
# 2.7: init_process_group(device_id=...) binds a group to any accelerator's device; before, to a CUDA device only
# (pytorch#143735)
GROUPS_BIND_TO_ANY_ACCELERATOR = TorchRelease(2, 7)
# 2.8: scaled_dot_product_attention asks the HPU device type which of its kernels to take (pytorch#149512); before, it
# always decomposes into the math backend's ops there
HPU_SDPA_CHOOSES_A_KERNEL = TorchRelease(2, 8)
# 2.8: gloo, which the virtual HCCL runs on, reduce-scatters lists of tensors (pytorch#149869); before, tensors only
GLOO_REDUCE_SCATTERS_LISTS = TorchRelease(2, 8)
# 2.8: gloo's backend options name their group (group_name, global_ranks_in_group), which split_group reads, as groups
# of backends other than NCCL can be split (pytorch#152175); 2.6 and 2.7 have neither
GLOO_OPTIONS_NAME_THEIR_GROUP = TorchRelease(2, 8)
# 2.9: the host has an fp8 GEMM, aten::_scaled_mm's CPU kernel (oneDNN), which the virtual Gaudi must not depend on;
# 2.6 and 2.7 have none (2.8 untested)
HOST_HAS_FP8_GEMM = TorchRelease(2, 9)
# 2.9: the device string "hpu" names torch's PrivateUse1 backend once that is renamed "hpu" (pytorch#157609); before,
# it always names the HPU device type, so the virtual Gaudi can be PrivateUse1 only from 2.9 on
PRIVATEUSE1_TAKES_BUILTIN_NAMES = TorchRelease(2, 9)
# 2.9: DTensor's random ops select hpu's counter-based generator (set_rng_ctx("philox")) around the states they read
# and write (pytorch#156581); before, they read hpu's default generator's state as a philox one and fail
DTENSOR_RANDOM_SELECTS_HPU_PHILOX = TorchRelease(2, 9)
# 2.10: torch.nn.SyncBatchNorm takes hpu tensors (2.9 has not); before, only CUDA's and those of torch's PrivateUse1
# backend, which hpu is for the virtual Gaudi on PyPI's builds from 2.9
SYNC_BATCHNORM_TAKES_HPU = TorchRelease(2, 10)
# 2.11: autocast no longer hands a weight it cast under no_grad or inference_mode, without autograd history, to the
# training after it in the same region (pytorch#165068; 2.9 has the bug, 2.10 is untested)
AUTOCAST_CACHE_KEEPS_GRAD_HISTORY = TorchRelease(2, 11)
# 2.12: a backend registered for a device takes it over from torch's fake process group (pytorch#174764). From 2.8
# (pytorch#159945) to 2.11, the fake group, which FSDP imports, claims "hpu" first and keeps it as the default backend
# of hpu
BACKEND_TAKES_DEVICES_FROM_FAKE = TorchRelease(2, 12)
# 2.13: autograd.Function.apply takes its forward's arguments by keyword too (pytorch#182205); before, positionally
# only, unless the Function defines setup_context
FUNCTION_APPLY_TAKES_KEYWORDS = TorchRelease(2, 13)


def release_of(version: str) -> TorchRelease:
    """The release a torch version string belongs to: ``"2.6.0a0+git1234"`` (Intel's builds) is 2.6."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"Not a torch version: {version!r}")
    return TorchRelease(int(match.group(1)), int(match.group(2)))


def installed() -> TorchRelease:
    """The release of the torch this process imports."""
    import torch

    return release_of(torch.__version__)


def hpu_group_device(device: "torch.device") -> "Optional[torch.device]":
    """The ``device_id`` that binds a process group to the hpu ``device`` where torch can: None before torch 2.7,
    which binds groups to CUDA devices only."""
    return device if installed() >= GROUPS_BIND_TO_ANY_ACCELERATOR else None


def gloo_options_name_their_group(options: object) -> bool:
    """Whether gloo's backend ``options`` carry their group's name and global ranks, which ``split_group`` reads
    (:data:`GLOO_OPTIONS_NAME_THEIR_GROUP`)."""
    return hasattr(options, "group_name") and hasattr(options, "global_ranks_in_group")


def sync_batchnorm_takes_hpu() -> bool:
    """Whether ``torch.nn.SyncBatchNorm`` normalises hpu tensors (:data:`SYNC_BATCHNORM_TAKES_HPU`)."""
    import torch

    return installed() >= SYNC_BATCHNORM_TAKES_HPU or torch._C._get_privateuse1_backend_name() == "hpu"


def fsdp2_sums_on_request() -> bool:
    """Whether FSDP2 reduces gradients with SUM when told (``set_force_sum_reduction_for_comms``, pytorch#155915: in
    2.9, not in 2.6; 2.7 and 2.8 untested). HCCL has no AVG, which FSDP2 takes otherwise for fp32 and bf16 gradients."""
    from torch.distributed.fsdp import FSDPModule

    return hasattr(FSDPModule, "set_force_sum_reduction_for_comms")


def function_result(result: "torch.Tensor", dtype: "torch.dtype") -> "torch.Tensor":
    """``result`` in ``dtype``, for an ``autograd.Function``'s forward to return: a new tensor only where the dtype
    differs.

    Compiled by torch 2.11, a Function whose result is the same tensor as another made in its forward (a ``.to()`` to
    the dtype a tensor has returns that tensor) routes the result's gradient to that other one, and its inputs get none
    (pytorch#180642, fixed in 2.12).
    """
    return result if result.dtype == dtype else result.to(dtype)


def is_supported(version: str) -> bool:
    """Whether torch ``version`` lies in the supported range."""
    return OLDEST <= release_of(version) <= NEWEST


def check_torch(version: str, what: str) -> None:
    """Raise ``RuntimeError`` naming the range and what to install when ``version`` lies outside it.

    Args:
        version: the torch version string, ``torch.__version__``.
        what: what needs the supported torch, for the message ("The virtual Gaudi").
    """
    if is_supported(version):
        return
    install = f"pip install 'torch>={OLDEST},<{NEWEST.major}.{NEWEST.minor + 1}'"
    if release_of(version) > NEWEST:
        advice = (
            f"Releases after {NEWEST} are not tested with it yet: install a supported one in a fresh virtual"
            f" environment (`{install}`)."
        )
    else:
        advice = (
            f"On a Gaudi, use Intel's Gaudi software 1.21 or newer, whose image ships torch {OLDEST} or later;"
            f" elsewhere install a supported torch in a fresh virtual environment (`{install}`)."
        )
    raise RuntimeError(f"{what} needs torch {OLDEST} to {NEWEST}, and this Python has torch {version}. {advice}")
