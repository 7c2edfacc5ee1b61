"""The ``Trainer``: upstream's, with what HPU training adds at the level of the Trainer.

Accelerator, strategy, devices, precision and plugins are resolved by upstream's accelerator connector, which builds
HPU objects for HPU flags (:mod:`_lightning_hpu`) in ``lightning.Trainer`` as much as here; its callback connector logs
the HPU line and picks the HPU progress bar in both alike. This Trainer adds ``profiler="hpu"``, the ranks' agreement on
SIGTERM and the performance report.
"""

import functools
import inspect
import os
from typing import Any, Callable, Literal, Optional, Union

import lightning.pytorch.trainer.trainer as _upstream
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.trainer.trainer import Trainer as _UpstreamTrainer
from lightning.pytorch.utilities.argparse import _defaults_from_env_vars
from lightning.pytorch.utilities.exceptions import MisconfigurationException

import _lightning_hpu
from _lightning_hpu import aliasing as _aliasing
from pytorch_lightning.accelerators.hpu import HPUAccelerator
from pytorch_lightning.callbacks import hpu_performance as performance
from pytorch_lightning.strategies._sigterm import _SignalConnector, _TrainingEpochLoop
from pytorch_lightning.trainer._compiled import keep_logging_eager
from pytorch_lightning.trainer.hpu_flags import resolve_profiler

# upstream's Trainer builds the connector that resolves HPU flags, also when PyTorch's device-backend autoload, which
# does it otherwise, is turned off or no Gaudi is present (HPU flags then fail clearly)
_lightning_hpu.install()


def _signature_with_fp8() -> inspect.Signature:
    """Upstream's signature, with ``precision="fp8"`` (Gaudi2 and newer) among the values the CLI accepts."""
    signature = inspect.signature(_UpstreamTrainer.__init__)
    precision = signature.parameters["precision"]
    widened = precision.replace(annotation=Optional[Union[precision.annotation, Literal["fp8"]]])
    return signature.replace(
        parameters=[widened if p.name == "precision" else p for p in signature.parameters.values()]
    )


def _in_its_own_process_group(stage: Callable[..., Any]) -> Callable[..., Any]:
    """Upstream's ``stage`` (``fit``, ``test``, ...), refused first in a process whose process group is of another size;
    same signature and docs."""

    @functools.wraps(stage)
    def run(trainer: "Trainer", *args: Any, **kwargs: Any) -> Any:
        _refuse_another_world_size(trainer)
        return stage(trainer, *args, **kwargs)

    return run


class Trainer(_UpstreamTrainer):
    """Upstream's ``Trainer`` with what HPU training adds at the level of the Trainer.

    It takes exactly upstream's arguments (``accelerator="hpu"``, ``strategy="hpu_parallel"``, ``precision=16`` on a
    Gaudi, ...), which it resolves as ``lightning.Trainer`` does; see :class:`lightning.pytorch.Trainer` for each of
    them. Both log the HPU line and, on HPUs, have a default progress bar that reads the logged values every
    ``log_every_n_steps`` steps. Added: ``profiler="hpu"``, and on HPUs the ranks' agreement on SIGTERM on the host,
    and the performance report (``PL_HPU_PERFORMANCE_REPORT=1``). ``PL_TRAINER_*`` environment variables act as
    defaults, as upstream.
    """

    @_defaults_from_env_vars
    def __init__(self, **kwargs: Any) -> None:
        if "profiler" in kwargs:
            kwargs["profiler"] = resolve_profiler(kwargs["profiler"])
        super().__init__(**kwargs)
        # upstream's, with the ranks of HPU strategies agreeing on SIGTERM on the host (see ``strategies/_sigterm.py``)
        self._signal_connector = _SignalConnector(self)
        steps = self.fit_loop.epoch_loop
        self.fit_loop.epoch_loop = _TrainingEpochLoop(self, min_steps=steps.min_steps, max_steps=steps.max_steps)
        _add_performance_monitor_if_asked(self)

    # each stage first checks the process group it would join, before anything is launched
    fit = _in_its_own_process_group(_UpstreamTrainer.fit)
    validate = _in_its_own_process_group(_UpstreamTrainer.validate)
    test = _in_its_own_process_group(_UpstreamTrainer.test)
    predict = _in_its_own_process_group(_UpstreamTrainer.predict)

    def _run(self, model: LightningModule, *args: Any, **kwargs: Any) -> Any:
        # every stage (fit, validate, test, predict) hands its unwrapped, possibly compiled, module to `_run`
        keep_logging_eager(model)
        return super()._run(model, *args, **kwargs)

    # LightningCLI/jsonargparse and the ``PL_TRAINER_*`` parser read the signature and docstring of ``__init__``
    __init__.__signature__ = _signature_with_fp8()  # type: ignore[attr-defined]
    __init__.__doc__ = _UpstreamTrainer.__init__.__doc__


def _refuse_another_world_size(trainer: "Trainer") -> None:
    """A process already in a process group (a notebook, a test run, an earlier run of another size) keeps it: a stage
    of another size would run alone in it while the processes it launched wait for it forever."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    existing = torch.distributed.get_world_size()
    # a stage on one device uses no process group
    if trainer.world_size > 1 and existing != trainer.world_size:
        raise MisconfigurationException(
            f"This process already belongs to a process group of {existing} process(es), but `Trainer(devices="
            f"{trainer.num_devices}, num_nodes={trainer.num_nodes})` runs {trainer.world_size}. Call"
            " `torch.distributed.destroy_process_group()` before creating the Trainer, or ask for"
            f" {existing} process(es)."
        )


def _add_performance_monitor_if_asked(trainer: Trainer) -> None:
    wanted = os.environ.get(performance.ENVIRONMENT_FLAG, "0") not in ("", "0")
    present = any(isinstance(callback, performance.HPUPerformanceMonitor) for callback in trainer.callbacks)
    if wanted and not present and isinstance(trainer.accelerator, HPUAccelerator):
        trainer.callbacks.append(performance.HPUPerformanceMonitor())


_aliasing.extend_upstream(__name__, _upstream)
