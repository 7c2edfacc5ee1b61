"""How the ranks of a multi-process HPU run tell a failure they share from one rank failing alone, and end the second.

Upstream kills the processes a launcher started only on ``KeyboardInterrupt``; on any other failure every rank is left
to the script. That is what a script needs when every rank fails alike, as ranks running one program on their shares of
one data set do: it may handle the error, and every rank stays alive and usable (a second ``fit`` works). When one rank
fails alone, the others wait: inside a collective for the process group's ``timeout`` (30 minutes), outside one (a
stuck file system, a deadlocked loader worker) for ever, keeping their HPUs. Lightning's launcher watches the processes
it started and ends every rank when one of them exits non-zero, but nothing watches the rank that launched them.

So every rank that fails reports it in the process group's store, which never waits, and only the rank that started
the others waits, for every rank's report of the same failure (each process numbers its failures: ranks that fail
together give theirs the same number), at most ``TIMEOUT`` seconds. Ranks that fail alike report within moments of
each other, and are left alone. A rank that has not reported by then is working, waiting or stuck: the launching rank
kills the processes it started, and Lightning's launcher ends the launching rank too once it sees them killed (or it
exits with its error first). A failure before the process group exists cannot be reported: the launching rank kills
the processes it started at once, as they wait for it in the group's set-up.
"""

import itertools
import logging
import signal
from datetime import timedelta
from typing import Optional

import torch.distributed as dist
from lightning.fabric.utilities.rank_zero import rank_prefixed_message
from lightning.pytorch.strategies.launchers.launcher import _Launcher
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

log = logging.getLogger(__name__)

# ranks that fail together reach their strategies' ``on_exception`` within moments of each other; the bound a rank
# failing alone waits before the others are ended, well under a minute
TIMEOUT = 20.0  # seconds

# this process's failures, numbered alike on ranks that fail together
_failures = itertools.count()


def end_ranks_left_alone(launcher: Optional[_Launcher], exception: BaseException) -> None:
    """Report this rank's failure; in the rank that started the others, kill them unless every rank reports it within
    ``TIMEOUT``. Called by every rank's strategy when a stage fails."""
    if isinstance(exception, KeyboardInterrupt):
        # upstream kills the processes it started itself, at once
        return
    started = isinstance(launcher, _SubprocessScriptLauncher) and bool(launcher.procs)
    if not (dist.is_available() and dist.is_initialized()):
        if started:
            _kill_started(launcher, "before the process group was set up")  # type: ignore[arg-type]
        return
    world_size, number = dist.get_world_size(), next(_failures)
    if world_size == 1:
        return
    store = dist.distributed_c10d._get_default_store()
    try:
        store.set(_key(number, dist.get_rank()), "failed")
    except dist.DistError:
        # the process that held the store has ended, and with it the run: there is no one to tell
        log.debug(rank_prefixed_message("Could not report the failure: the store has gone", dist.get_rank()))
        return
    if not started:
        return
    keys = [_key(number, rank) for rank in range(world_size)]
    try:
        store.wait(keys, timedelta(seconds=TIMEOUT))
    except dist.DistStoreError:
        silent = [rank for rank, key in enumerate(keys) if not store.check([key])]
        _kill_started(launcher, f"alone: ranks {silent} reported no failure within {TIMEOUT:g} s")  # type: ignore[arg-type]


def _key(number: int, rank: int) -> str:
    return f"lightning_hpu/failure/{number}/rank/{rank}"


def _kill_started(launcher: _SubprocessScriptLauncher, how: str) -> None:
    rank = launcher.cluster_environment.global_rank()
    log.warning(rank_prefixed_message(f"This rank failed {how}. Killing the processes it started.", rank))
    launcher.kill(signal.SIGKILL)
