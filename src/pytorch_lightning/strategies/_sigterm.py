"""How the ranks of a multi-process HPU run agree on a SIGTERM without reading a device tensor back at every step.

Upstream's training loop broadcasts a flag tensor on the root device at the start of every training step and reads it
back with ``.item()`` (``_TrainingEpochLoop._broadcast_sigterm_tensor``); its SIGTERM handler broadcasts one too. On
Gaudi that read makes the host wait for the device to finish the previous step before it can record the next one, at
every step on every rank. A SIGTERM flag is host state: HPU strategies agree on it over a CPU (gloo) process group of
their own instead, without waiting for that exchange either, and only every few steps. Our ``Trainer`` uses the loop
and signal connector below, which do so whenever the strategy has a :class:`SigtermAgreement`, and leave upstream's
behaviour unchanged otherwise.

A SIGTERM is noted, not acted on, where it arrives. At the start of the first training step every rank starts an
exchange of its flag; each exchange is collected ``N`` steps after it started, at the start of the step where the next
one starts. If any rank had noted a SIGTERM when the collected one started, all of them set
``trainer.received_sigterm`` and raise upstream's ``SIGTERMException`` at that same step. (Acting on it at once, as
upstream's checks at the end of a step do, would stop the receiving rank alone and leave the others waiting in the next
collective.) ``N`` is agreed in the exchanges themselves: each rank proposes enough steps for exchanges to start at
least ``_PERIOD`` (50 ms) apart, by its own timing of the steps since the previous exchange, but at most
``_MAX_INTERVAL`` (16). The largest proposal comes back with the flag, the same on every rank, and is the number of
steps after which the exchange started at that step is collected. ``N`` is 1 until measured, and whenever steps take
longer than 50 ms.

Reaction time: a SIGTERM that arrives during step ``k`` is noted at the start of step ``k + 1`` and sent with the first
exchange that starts then or later; every rank stops at the collection of that exchange, within two intervals: at the
start of step ``k + N1 + N2`` at the latest, ``N1`` the interval in which it is noted and ``N2`` the next (at most 16
each). With steps of a steady duration ``t`` an interval lasts under ``50 ms + t``, so every rank stops less than
``2 * (50 ms + t)`` after the signal; with steps longer than 50 ms, ``N`` is 1 and they stop at the start of step
``k + 2`` (a blocking exchange at every step would stop them at ``k + 1``). Intervals follow a change in step time
two exchanges late: right after steps slow down, the bound in steps holds, not the one in time. In exchange no step
waits for the other ranks or for an exchange, and the steps between exchanges do nothing but count.
A SIGTERM that arrives too late in a fit for its exchange to be collected by the last step (at most in its last two
intervals) does not stop it: the fit ends as planned, and only the receiving rank reports ``received_sigterm``.
"""

import logging
import math
import time
import weakref
from types import FrameType
from typing import Callable, Optional

import torch
import torch.distributed as dist
from lightning.fabric.utilities.rank_zero import rank_prefixed_message
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop as _UpstreamTrainingEpochLoop
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector as _UpstreamSignalConnector
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

# upstream's logger for this message, so that it shows where upstream's does
log = logging.getLogger("lightning.pytorch.trainer.connectors.signal_connector")

# the upstream hooks overridden here; tests check that upstream still has them
OVERRIDDEN_UPSTREAM_HOOKS = (
    (_UpstreamTrainingEpochLoop, "_broadcast_sigterm_tensor"),
    (_UpstreamSignalConnector, "_sigterm_notifier_fn"),
)

# the least time between the starts of two exchanges: launching one costs the host 0.1-0.15 ms, under 0.3 % of 50 ms,
# and a SIGTERM still stops the ranks within a fraction of a second, where schedulers grant tens before a SIGKILL
_PERIOD = 0.05  # seconds
# the most calls between two exchanges: it bounds the reaction, in steps, when steps slow down after they were timed;
# exchanges come more often than ``_PERIOD`` only with steps under 3 ms, where one costs under 0.01 ms per step
_MAX_INTERVAL = 16


# the gloo group of the agreements, by the default process group it was made after; it goes when that group goes
_HOST_GROUPS: "weakref.WeakKeyDictionary[dist.ProcessGroup, dist.ProcessGroup]" = weakref.WeakKeyDictionary()


def _host_group() -> dist.ProcessGroup:
    """The gloo group the agreements exchange over, made by the first one after the default process group was made,
    and kept while that group lives.

    Every rank makes it at the same point, in the set-up of the first stage, and no later stage makes a group: the name
    torch gives a new group is a count of the groups made before it in the process, so a group made at each stage
    would wait for ever on ranks whose counts differ, because user code or a library made a group on some ranks only.
    """
    world = dist.group.WORLD
    group = _HOST_GROUPS.get(world)  # type: ignore[arg-type]
    if group is None:
        # the group carries CPU tensors only, but names a backend for the HPU too: a group created while the main
        # one is bound to an HPU (``init_process_group(device_id=...)``, as Lightning does) is bound to it as well
        group = dist.new_group(backend="cpu:gloo,hpu:gloo")
        # torch names no default backend for a group of "device:backend" pairs when a backend plugin ("hccl") is
        # registered, and warns "No backend of type 0 found" when the group is destroyed
        group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        _HOST_GROUPS[world] = group  # type: ignore[index]
    return group


def _proposed_interval(seconds_per_call: float) -> int:
    """Enough calls for exchanges to start at least ``_PERIOD`` apart, at most ``_MAX_INTERVAL``."""
    if seconds_per_call * _MAX_INTERVAL <= _PERIOD:
        return _MAX_INTERVAL
    return math.ceil(_PERIOD / seconds_per_call)


class SigtermAgreement:
    """The ranks' agreement on SIGTERM, over a gloo process group made (collectively) once after the main one.

    Every ``N`` calls it collects the all-reduce (MAX) of two CPU integers it started ``N`` calls before, each rank's
    flag and proposed ``N``, and starts the next one without waiting for it; the calls in between only count. The one
    it collects has normally finished long before: the ranks have met in the steps' gradient collectives since, and
    gloo exchanges the integers on a thread of its own. So no rank waits, for its device or for the other ranks, and
    every rank gets the same answer and the same ``N`` at the same call. ``N`` starts at 1; each rank proposes it from
    its ``clock`` (see the module's docstring).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.group = _host_group()
        self._clock = clock
        # the exchange started last and not collected yet, and its tensor: [flag, proposed interval]
        self._in_flight: Optional[tuple[dist.Work, torch.Tensor]] = None
        self._interval = 1  # calls from the start of the last exchange to the next
        self._calls_left = 1  # until the next exchange
        self._started_at: Optional[float] = None  # by ``clock``, the last exchange

    def any_rank(self, noted: bool) -> bool:
        """Whether any rank passed ``noted=True`` to the call that started the exchange this call collects. Only the
        calls that start one read ``noted``: once ``True``, it must stay so. Every rank must call it, at the same
        points, and gets ``True`` at the same call; after that nothing is left in flight: the ranks are expected to
        stop."""
        self._calls_left -= 1
        if self._calls_left > 0:
            return False
        calls = self._interval  # since the last exchange started
        if self._in_flight is not None:
            work, exchanged = self._in_flight
            work.wait()
            self._in_flight = None
            agreed, self._interval = exchanged.tolist()
            if agreed:
                return True
        now = self._clock()
        proposed = 1 if self._started_at is None else _proposed_interval((now - self._started_at) / calls)
        self._started_at = now
        exchanged = torch.tensor([int(noted), proposed])
        self._in_flight = dist.all_reduce(exchanged, op=dist.ReduceOp.MAX, group=self.group, async_op=True), exchanged
        self._calls_left = self._interval
        return False

    def close(self) -> None:
        """Collect the exchange in flight, which every rank started at the same call, so that the group is ready for
        the next stage's agreement. No rank gives up on it: one that did would leave its peers waiting in it."""
        if self._in_flight is not None:
            self._in_flight[0].wait()
            self._in_flight = None

    def abandon(self) -> None:
        """After a failure, when the other ranks may never start the exchange in flight (if any): the group is then
        destroyed without waiting for it, and the next agreement makes another."""
        if self._in_flight is None:
            return
        self._in_flight = None
        world = dist.group.WORLD
        if world is not None and _HOST_GROUPS.pop(world, None) is not None:
            dist.destroy_process_group(self.group)


def _agreement(trainer: object) -> Optional[SigtermAgreement]:
    return getattr(getattr(trainer, "strategy", None), "sigterm_agreement", None)


class _SignalConnector(_UpstreamSignalConnector):
    """Upstream's, except that with a :class:`SigtermAgreement` a SIGTERM is only noted (and forwarded to the
    processes this one launched, as upstream does), for the ranks to agree on at a later step."""

    sigterm_noted = False

    @override
    def register_signal_handlers(self) -> None:
        self.sigterm_noted = False
        super().register_signal_handlers()

    @override
    def _sigterm_notifier_fn(self, signum: int, frame: Optional[FrameType]) -> None:
        if _agreement(self.trainer) is None:
            super()._sigterm_notifier_fn(signum, frame)  # type: ignore[arg-type]
            return
        log.info(rank_prefixed_message(f"Received SIGTERM: {signum}", self.trainer.local_rank))
        if not self.sigterm_noted:
            launcher = self.trainer.strategy.launcher
            if launcher is not None:
                launcher.kill(signum)
        self.sigterm_noted = True

    @override
    def teardown(self) -> None:
        # a signal noted after the last step: this rank did receive it
        self.received_sigterm = self.received_sigterm or self.sigterm_noted
        super().teardown()


class _TrainingEpochLoop(_UpstreamTrainingEpochLoop):
    """Upstream's, agreeing on SIGTERM through the strategy's :class:`SigtermAgreement` when it has one."""

    @override
    def _broadcast_sigterm_tensor(self) -> None:
        agreement = _agreement(self.trainer)
        if agreement is None:
            super()._broadcast_sigterm_tensor()
            return
        connector = self.trainer._signal_connector
        if agreement.any_rank(connector.sigterm_noted):
            connector.received_sigterm = True
            raise SIGTERMException
