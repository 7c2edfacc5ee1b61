"""How the ranks of a multi-process HPU run agree on a SIGTERM without reading a device tensor back at every step.

Upstream's training loop broadcasts a flag tensor on the root device at the start of every training step and reads it
back with ``.item()`` (``_TrainingEpochLoop._broadcast_sigterm_tensor``); its SIGTERM handler broadcasts one too. On
Gaudi that read makes the host wait for the device to finish the previous step before it can record the next one, at
every step on every rank. A SIGTERM flag is host state: HPU strategies agree on it over a CPU (gloo) process group of
their own instead, without waiting for that exchange either. Our ``Trainer`` uses the loop and signal connector below,
which do so whenever the strategy has a :class:`SigtermAgreement`, and leave upstream's behaviour unchanged otherwise.

A SIGTERM is noted, not acted on, where it arrives. At the start of each training step every rank starts an exchange of
its flag and collects the one the ranks started at the previous step; if any rank had noted a SIGTERM before that one,
all of them set ``trainer.received_sigterm`` and raise upstream's ``SIGTERMException`` at that same step. (Acting on it
at once, as upstream's checks at the end of a step do, would stop the receiving rank alone and leave the others waiting
in the next collective.)

Reaction time: one training step more than a blocking exchange. A SIGTERM that arrives during step ``k`` stops every
rank at the start of step ``k + 2`` (a blocking exchange would stop them at ``k + 1``); in exchange no step waits for
the other ranks or for the exchange.
A SIGTERM that arrives during the last two steps of a fit does not stop it: the fit ends as planned, and only the
receiving rank reports ``received_sigterm``.
"""

import contextlib
import logging
from datetime import timedelta
from types import FrameType
from typing import Optional

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

# how long ``SigtermAgreement.close`` waits for an exchange still in flight (normally none, or one long finished)
_LAST_EXCHANGE_TIMEOUT = timedelta(seconds=5)


class SigtermAgreement:
    """The ranks' agreement on SIGTERM, over a gloo process group created (collectively) with the main one.

    Each call starts an all-reduce of a CPU integer without waiting for it, and returns the result of the one the
    previous call started. That one has normally finished long before: the ranks have met in the step's gradient
    collectives since, and gloo exchanges the integer on a thread of its own. So no rank waits, for its device or for
    the other ranks, and every rank gets the same answer at the same call, one call later than a blocking all-reduce
    would give it.
    """

    def __init__(self) -> None:
        # the group carries CPU tensors only, but must name a backend for the HPU too: a group created while the main
        # one is bound to an HPU (``init_process_group(device_id=...)``, as Lightning does) is bound to it as well
        self.group = dist.new_group(backend="cpu:gloo,hpu:gloo")
        # torch names no default backend for a group of "device:backend" pairs when a backend plugin ("hccl") is
        # registered, and warns "No backend of type 0 found" when the group is destroyed
        self.group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._in_flight: Optional[dist.Work] = None

    def any_rank(self, noted: bool) -> bool:
        """Whether any rank passed ``noted=True`` to the previous call (``False`` at the first); every rank must call
        it, at the same points. After it returned ``True`` nothing is left in flight: the ranks are expected to stop."""
        agreed = False
        if self._in_flight is not None:
            self._in_flight.wait()
            self._in_flight = None
            agreed = bool(self._flag.item())
        if not agreed:
            self._flag.fill_(int(noted))
            self._in_flight = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return agreed

    def close(self) -> None:
        if self._in_flight is not None:
            # the last exchange has finished unless a rank failed before starting it: then give up on it after a
            # while (destroying the group abandons it) rather than hold up this rank's teardown
            with contextlib.suppress(RuntimeError):
                self._in_flight.wait(timeout=_LAST_EXCHANGE_TIMEOUT)
            self._in_flight = None
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
