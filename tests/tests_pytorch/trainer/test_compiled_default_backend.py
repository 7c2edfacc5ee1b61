"""``torch.compile(model)`` with torch's default backend, as CUDA code writes it, trained on HPUs.

Inductor has no HPU code generation: without the HPU strategies compiling such a module with ``hpu_backend`` it fails
at the first step. The runs on 2 HPUs are in ``fabric/test_compiled_two_hpus.py``.
"""

import logging

import lightning as L
import pytest
import torch
from habana_frameworks.torch.hpu.metrics import metric_global
from lightning.pytorch.utilities.exceptions import MisconfigurationException

import pytorch_lightning as pl
from lightning_fabric.strategies._hpu_compile import hpu_compile_arguments
from pytorch_lightning.accelerators import HPUAccelerator
from pytorch_lightning.strategies import SingleHPUStrategy
from tests_pytorch.helpers import compiled_run

pytestmark = pytest.mark.usefixtures("fresh_compilation_state")


def _compilations() -> int:
    return dict(metric_global("graph_compilation").stats())["TotalNumber"]


def test_inductor_becomes_hpu_backend_with_dynamos_arguments_kept():
    assert hpu_compile_arguments({}, lazy=False) == {"backend": "hpu_backend"}
    chosen = hpu_compile_arguments({"fullgraph": True, "dynamic": False, "mode": "max-autotune"}, lazy=False)
    assert chosen == {"fullgraph": True, "dynamic": False, "backend": "hpu_backend"}
    named = {"backend": "inductor", "options": {"triton.cudagraphs": True}}
    assert hpu_compile_arguments(named, lazy=False) == {"backend": "hpu_backend"}
    for kept in ({"backend": "hpu_backend", "fullgraph": True}, {"backend": "aot_eager"}):
        assert hpu_compile_arguments(kept, lazy=False) is kept


def test_lazy_mode_runs_the_default_backend_uncompiled_and_refuses_hpu_backend():
    assert hpu_compile_arguments({"dynamic": True}, lazy=True) is None
    with pytest.raises(MisconfigurationException, match="eager mode only.*Unset PT_HPU_LAZY_MODE"):
        hpu_compile_arguments({"backend": "hpu_backend"}, lazy=True)


def _trainer(trainer_class, tmp_path, **kwargs):
    flags = dict(max_steps=compiled_run.STEPS, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    return trainer_class(default_root_dir=tmp_path, enable_model_summary=False, **flags, **kwargs)


def _fit(trainer, how: str) -> list:
    torch.manual_seed(7)
    module = compiled_run.Net()
    loader = torch.utils.data.DataLoader(list(zip(*compiled_run.data(0, 1))), batch_size=compiled_run.ROWS)
    trainer.fit(compiled_run.compiled(module, how), loader)
    return module.losses


@pytest.mark.parametrize(
    "trainer_class, flags",
    [
        (pl.Trainer, {"accelerator": "hpu", "devices": 1}),
        # upstream's Trainer, given the HPU classes
        (L.Trainer, {"accelerator": HPUAccelerator(), "strategy": SingleHPUStrategy()}),
    ],
    ids=["pytorch_lightning", "lightning"],
)
def test_trainer_runs_the_default_backend_as_hpu_backend(tmp_path, caplog, trainer_class, flags):
    eager = _fit(_trainer(trainer_class, tmp_path / "eager", **flags), "none")
    assert _compilations() == 0
    with caplog.at_level(logging.INFO):
        compiled = _fit(_trainer(trainer_class, tmp_path / "compiled", **flags), "default")
    # the training step's forward and backward, compiled once
    assert _compilations() == 2
    assert len(compiled) == compiled_run.STEPS
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)
    said = [record.getMessage() for record in caplog.records if "backend='hpu_backend'" in record.getMessage()]
    assert len(said) == 1 and "default backend (inductor)" in said[0]


def test_fabric_runs_the_default_backend_as_hpu_backend(caplog):
    losses = {}
    for how in ("none", "default"):
        fabric = L.Fabric(accelerator="hpu", devices=1)
        with caplog.at_level(logging.INFO):
            losses[how] = compiled_run.fabric_losses(fabric, how)
    assert _compilations() == 2
    torch.testing.assert_close(losses["default"], losses["none"], rtol=1e-4, atol=1e-5)
    said = [record.getMessage() for record in caplog.records if "backend='hpu_backend'" in record.getMessage()]
    assert len(said) == 1
    # nothing stays armed for the next Fabric
    assert not torch.nn.modules.module._global_module_registration_hooks


def test_fabric_keeps_a_backend_named_explicitly():
    fabric = L.Fabric(accelerator="hpu", devices=1)
    module = fabric.setup_module(torch.compile(compiled_run.Net(), backend="aot_eager", dynamic=False))
    assert module._forward_module._compile_kwargs == {"backend": "aot_eager", "dynamic": False}


class _TwoCompiledBlocks(compiled_run.Net):
    """Blocks compiled one by one with the default backend, as models compile their layers (in ``__init__``, or in
    ``configure_model`` for FSDP2)."""

    def __init__(self, compile_in_configure_model: bool) -> None:
        super().__init__()
        self.later = compile_in_configure_model
        self.head = torch.nn.Linear(3, 3)
        if not self.later:
            self._compile_blocks()

    def _compile_blocks(self) -> None:
        self.net, self.head = torch.compile(self.net), torch.compile(self.head)

    def configure_model(self) -> None:
        if self.later:
            self._compile_blocks()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(x))


@pytest.mark.parametrize("compile_in_configure_model", [False, True], ids=["init", "configure_model"])
def test_trainer_runs_compiled_submodules_as_hpu_backend(tmp_path, caplog, compile_in_configure_model):
    losses = {}
    for compiled in (False, True):
        torch.manual_seed(7)
        module = _TwoCompiledBlocks(compile_in_configure_model) if compiled else _TwoCompiledBlocks(True)
        if not compiled:
            module.configure_model = lambda: None  # the same layers, never compiled
        loader = torch.utils.data.DataLoader(list(zip(*compiled_run.data(0, 1))), batch_size=compiled_run.ROWS)
        with caplog.at_level(logging.INFO):
            _trainer(pl.Trainer, tmp_path / str(compiled), accelerator="hpu", devices=1).fit(module, loader)
        losses[compiled] = module.losses
    # each block's forward and backward, compiled once
    assert _compilations() == 4
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-4, atol=1e-5)
    said = [record.getMessage() for record in caplog.records if "backend='hpu_backend'" in record.getMessage()]
    assert len(said) == 1


def test_fabric_runs_compiled_submodules_as_hpu_backend(caplog):
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.compile(compiled_run.Block()), torch.nn.Linear(3, 3))
    fabric = L.Fabric(accelerator="hpu", devices=1)
    with caplog.at_level(logging.INFO):
        model = fabric.setup_module(model)
    fabric.backward(model(torch.randn(4, 6, device=fabric.device)).sum())
    assert _compilations() == 2
    assert sum("backend='hpu_backend'" in record.getMessage() for record in caplog.records) == 1
