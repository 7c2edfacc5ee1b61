"""What every HPU strategy does on top of its upstream base: Gaudi checkpoint I/O and lazy-mode graph cuts."""

from typing import Any, Callable, Optional

from lightning.fabric.plugins import CheckpointIO
from torch import Tensor
from torch.optim import Optimizer

from pytorch_lightning.plugins.io.hpu import HPUCheckpointIO


class _HPUStrategyMixin:
    """Mixed into each HPU strategy, before its upstream base class.

    In lazy mode Gaudi records operations into a graph that runs when ``mark_step()`` cuts it. We cut where a unit of
    device work ends: after backward, after the optimizer step, and before and after each evaluation step, so graphs
    keep the same shape from step to step and are compiled once. In eager mode there is nothing to cut and we add no
    call. We never read a value back to the host here: that would force the pending graph to run mid-step.
    """

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

    def _setup_graph_cuts(self) -> None:
        import habana_frameworks.torch.core as htcore

        self._graph_cut = htcore.mark_step if htcore.is_lazy() else None

    def _cut_graph(self) -> None:
        if self._graph_cut is not None:
            self._graph_cut()

    def setup_environment(self) -> None:
        self._setup_graph_cuts()
        super().setup_environment()  # type: ignore[misc]

    def backward(self, closure_loss: Tensor, optimizer: Optional[Optimizer], *args: Any, **kwargs: Any) -> Tensor:
        output = super().backward(closure_loss, optimizer, *args, **kwargs)  # type: ignore[misc]
        self._cut_graph()
        return output

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        output = super().optimizer_step(optimizer, closure, model, **kwargs)  # type: ignore[misc]
        self._cut_graph()
        return output

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
