"""What every HPU strategy of the Trainer adds to the HPU strategy core it shares with Fabric
(:mod:`lightning_fabric.strategies._hpu`): the LightningModule's compile backend and evaluation steps, failures, and
SIGTERM."""

from typing import Any, Callable, Optional

import torch.distributed as dist

from lightning_fabric.strategies._hpu import _destroy_process_group_at_exit, _HPUStrategyMixin
from lightning_fabric.strategies._hpu_compile import compile_submodules_for_hpu
from pytorch_lightning.plugins.precision.hpu import HPUPrecisionPlugin
from pytorch_lightning.strategies._failure import end_ranks_left_alone
from pytorch_lightning.strategies._sigterm import SigtermAgreement
from pytorch_lightning.trainer._compiled import run_lightning_module_for_hpu


class _HPUTrainerStrategyMixin(_HPUStrategyMixin):
    """What the Trainer's HPU strategies add: graph cuts around each evaluation step, failures reported to the
    precision plugin, and, with several processes, the ranks' agreement on SIGTERM over a CPU process group
    (``sigterm_agreement``) rather than upstream's per-step broadcast of a device tensor read back on the host, and the
    end of the processes a rank started when it fails alone (see ``_failure.py``)."""

    sigterm_agreement: Optional[SigtermAgreement] = None

    def setup_environment(self) -> None:
        super().setup_environment()
        self._setup_sigterm_agreement()

    def connect(self, model: Any) -> None:
        # a module compiled with torch's default backend runs with Gaudi's (see ``_hpu_compile``)
        run_lightning_module_for_hpu(model)
        super().connect(model)  # type: ignore[misc]

    def setup(self, trainer: Any) -> None:
        # its compiled submodules too, the ones ``configure_model`` compiled included, which ran since ``connect``
        compile_submodules_for_hpu(self.lightning_module)  # type: ignore[attr-defined]
        super().setup(trainer)  # type: ignore[misc]

    def _setup_sigterm_agreement(self) -> None:
        """Once the process group is up: with several processes, the ranks' host-side agreement on SIGTERM."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self.sigterm_agreement = SigtermAgreement()
            # its group lives as long as the process group, which must end before the interpreter does
            _destroy_process_group_at_exit()

    def teardown(self) -> None:
        if self.sigterm_agreement is not None:
            self.sigterm_agreement.close()
            self.sigterm_agreement = None
        super().teardown()  # type: ignore[misc]

    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)  # type: ignore[misc]
        if self.sigterm_agreement is not None:
            self.sigterm_agreement.abandon()
        # the plugin then leaves what the run gathered unpublished (fp8 measurements)
        if isinstance(self.precision_plugin, HPUPrecisionPlugin):  # type: ignore[attr-defined]
            self.precision_plugin.on_exception(exception)  # type: ignore[attr-defined]
        end_ranks_left_alone(self.launcher, exception)  # type: ignore[attr-defined]

    def _evaluation_step(self, step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._cut_graph()
        output = step(*args, **kwargs)
        self._cut_graph()
        return output

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._evaluation_step(super().validation_step, *args, **kwargs)  # type: ignore[misc]

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._evaluation_step(super().test_step, *args, **kwargs)  # type: ignore[misc]

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._evaluation_step(super().predict_step, *args, **kwargs)  # type: ignore[misc]
