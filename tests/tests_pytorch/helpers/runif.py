"""``RunIf``: skip a test unless the machine has what it needs, and place it in its tier.

The suite has three tiers, told apart by markers (see ``docs/source-pytorch/hpu_testing.rst``):

* ``virtual_hpu``: tests of what only the virtual Gaudi exposes (its accounting, allocator, fallbacks, knobs, and all of
  ``tests/tests_virtual_hpu``); skipped on hardware.
* ``hpu``: tests of what only hardware can show (HCCL over a node's cards, real memory, the bridge's compilation
  counts, fp8 on Gaudi2/3, speed); ``pytest -m hpu`` selects them, and they are skipped without a Gaudi.
* unmarked: the integration tests, which run on both.

With ``VIRTUAL_HPU_AS_HARDWARE=1`` the virtual Gaudi poses as hardware (the rehearsal): the ``hpu`` tier runs on it,
the ``virtual_hpu`` tier is skipped, and the tests marked ``physical`` (speed, HBM), which only silicon can pass, are
skipped with their reason.
"""

import importlib.util
import os
import sys
from collections.abc import Iterable
from typing import Any

import pytest

HPU, VIRTUAL_HPU = "hpu", "virtual_hpu"
# FSDP2 (``fully_shard``) on HPUs: the strategies refuse it before torch 2.9, which test_hpu_model_parallel checks
NO_FSDP2 = "FSDP2 on HPUs needs torch 2.9+ (set_force_sum_reduction_for_comms); older ones refuse it"


def fsdp2_runs() -> bool:
    """Whether the installed torch runs FSDP2 on HPUs (the strategies refuse it otherwise)."""
    from virtual_hpu import torch_support

    return torch_support.fsdp2_sums_on_request()


NEEDS_FSDP2 = pytest.mark.skipif(not fsdp2_runs(), reason=NO_FSDP2)


def _virtual_gaudi_active() -> bool:
    virtual = sys.modules.get("virtual_hpu")
    return virtual is not None and virtual.is_active()


def _real_gaudi_installed() -> bool:
    return importlib.util.find_spec("habana_frameworks") is not None and not _virtual_gaudi_active()


def _rehearsal() -> bool:
    return os.environ.get("VIRTUAL_HPU_AS_HARDWARE", "").strip() == "1"


def RunIf(
    hpu: bool = False,
    virtual_hpu: bool = False,
    physical: str = "",
    tb_profiler: bool = False,
    **kwargs: Any,
) -> pytest.MarkDecorator:
    """A ``skipif`` mark for what the test needs; ``hpu`` and ``virtual_hpu`` also put the test in that tier.

    Args:
        hpu: a real Intel Gaudi (or the rehearsal). Tests of the integration itself run on the virtual Gaudi and need
            no mark; this is for what only hardware can show (HCCL across cards, memory, graph compilation, speed).
        virtual_hpu: the virtual Gaudi, for tests that read what real hardware does not expose (its accounting of
            graph cuts and host syncs, its allocator pools, its simulation knobs).
        physical: with ``hpu``, why only silicon can pass the test (a speed-up, the size of HBM); the rehearsal skips it
            with that reason.
        tb_profiler: the optional ``torch-tb-profiler`` package (requirements/profiler.txt).
    """
    reasons = []
    if hpu and not _real_gaudi_installed():
        reasons.append("a real Intel Gaudi")
    if hpu and physical and _rehearsal():
        reasons.append(f"real silicon ({physical}), which the rehearsal has not")
    if virtual_hpu and not _virtual_gaudi_active():
        reasons.append("the virtual Gaudi (it reads what hardware does not expose)")
    if tb_profiler and importlib.util.find_spec("torch_tb_profiler") is None:
        reasons.append("the optional `torch-tb-profiler` package")
    tier = HPU if hpu else VIRTUAL_HPU if virtual_hpu else None
    return pytest.mark.skipif(bool(reasons), reason=f"Requires {' and '.join(reasons)}", tier=tier, **kwargs)


def tier_of(item: pytest.Item) -> Any:
    """The tier a ``RunIf`` mark put ``item`` in, or None."""
    return next((mark.kwargs["tier"] for mark in item.iter_markers("skipif") if mark.kwargs.get("tier")), None)


#: a variant of a scenario that the default set runs in another form: ``make test`` leaves it out for CI's time budget
#: (its multi-process runs cost 10 to 60 s each on two cores); ``pytest -m stress`` runs it
VARIANT = pytest.mark.stress(reason="a variant of a scenario the default set runs in another form (CI's time budget)")


def variants(values: Iterable[Any], kept: Iterable[Any]) -> list:
    """The values of a parametrization, each that is not in ``kept`` marked :data:`VARIANT`."""
    kept = list(kept)
    return [value if value in kept else pytest.param(value, marks=VARIANT) for value in values]
