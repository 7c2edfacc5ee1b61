"""Gradient clipping by norm on HPUs uses Gaudi's fused clip-norm (``hpex.normalization.FusedClipNorm``): the Trainer's
``gradient_clip_val`` and Fabric's ``clip_gradients`` end where the same runs on the CPU end, step by step, in fp32 and
bf16; what the fused op cannot compute as torch does goes to torch."""

import lightning as L
import pytest
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pytorch_lightning as pl
from pytorch_lightning.plugins.precision.hpu_fsdp import HPUFSDPPrecision

QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}
# the limit is far below the gradients' norm: every step clips
MAX_NORM = 0.05
PRECISIONS = ["32-true", "bf16-true", "bf16-mixed"]


def _tolerance(precision: str) -> dict:
    return dict(rtol=1e-5, atol=1e-6) if precision == "32-true" else dict(rtol=2e-2, atol=2e-2)


@pytest.fixture
def fused_clips(monkeypatch) -> list:
    """The norms returned by the bridge's fused clip-norm, one per call."""
    from habana_frameworks.torch.hpex.normalization import FusedClipNorm

    calls = []
    clip_norm = FusedClipNorm.clip_norm

    def recording(self, parameters):
        calls.append(clip_norm(self, parameters))
        return calls[-1]

    monkeypatch.setattr(FusedClipNorm, "clip_norm", recording)
    return calls


def _data(steps: int = 4) -> DataLoader:
    generator = torch.Generator().manual_seed(3)
    x, y = torch.randn(8 * steps, 16, generator=generator), torch.randn(8 * steps, 4, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=8)


def _network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


class _Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.network = _network()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.network(x).float(), y.float()) * 100

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _ParametersPerStep(Callback):
    def __init__(self) -> None:
        self.steps: list[list[torch.Tensor]] = []

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self.steps.append([p.detach().float().cpu().clone() for p in pl_module.parameters()])


def _fit(accelerator: str, precision: str, **clipping) -> list:
    record = _ParametersPerStep()
    trainer = pl.Trainer(
        accelerator=accelerator, devices=1, precision=precision, max_epochs=1, callbacks=[record], **clipping, **QUIET
    )
    trainer.fit(_Regression(), train_dataloaders=_data())
    return record.steps


@pytest.mark.parametrize(
    ("hpu_mode", "precision"), [("eager", precision) for precision in PRECISIONS] + [("lazy", "32-true")]
)
def test_trainer_clips_by_norm_with_the_fused_op_as_on_the_cpu(hpu_mode, precision, fused_clips):
    hpu = _fit("hpu", precision, gradient_clip_val=MAX_NORM)
    assert len(fused_clips) == len(hpu) == 4
    # it clipped: the norm before clipping was far above the limit
    assert all(norm.float().item() > 10 * MAX_NORM for norm in fused_clips)
    cpu = _fit("cpu", precision, gradient_clip_val=MAX_NORM)
    for step, (got, want) in enumerate(zip(hpu, cpu)):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, **_tolerance(precision), msg=f"step {step}")


def test_trainer_clips_by_value_without_it(fused_clips):
    hpu = _fit("hpu", "32-true", gradient_clip_val=0.01, gradient_clip_algorithm="value")
    assert fused_clips == []
    cpu = _fit("cpu", "32-true", gradient_clip_val=0.01, gradient_clip_algorithm="value")
    for a, b in zip(hpu[-1], cpu[-1]):
        torch.testing.assert_close(a, b, **_tolerance("32-true"))


def test_trainer_fsdp_keeps_refusing_norm_clipping_on_shards():
    """Each FSDP process holds shards of the gradients, whose total norm needs a collective the fused op lacks:
    upstream's refusal stands."""
    with pytest.raises(MisconfigurationException, match="not supported for `FSDPPrecision`|FSDPPrecision"):
        HPUFSDPPrecision("bf16-mixed").clip_grad_by_norm(torch.optim.SGD(_network().parameters(), lr=0.1), 1.0)


def _fabric_gradients(accelerator: str, precision: str):
    fabric = L.Fabric(accelerator=accelerator, devices=1, precision=precision)
    model = _network()
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = (t.to(fabric.device) for t in next(iter(_data(1))))
    fabric.backward(nn.functional.mse_loss(model(x).float(), y) * 100)
    return fabric, model, optimizer


@pytest.mark.parametrize("precision", PRECISIONS)
def test_fabric_clip_gradients_returns_the_norm_of_the_cpu_and_clips_as_it(precision, fused_clips):
    results = {}
    for accelerator in ("hpu", "cpu"):
        fabric, model, optimizer = _fabric_gradients(accelerator, precision)
        norm = fabric.clip_gradients(model, optimizer, max_norm=MAX_NORM)
        results[accelerator] = norm, [p.grad.float().cpu() for p in model.parameters()]
    (hpu_norm, hpu_grads), (cpu_norm, cpu_grads) = results["hpu"], results["cpu"]
    assert len(fused_clips) == 1
    # torch's form: a 0-dim tensor in the gradients' dtype, on their device
    assert hpu_norm.shape == cpu_norm.shape == () and hpu_norm.dtype == cpu_norm.dtype
    assert hpu_norm.device.type == "hpu"
    torch.testing.assert_close(hpu_norm.cpu(), cpu_norm, **_tolerance(precision))
    for a, b in zip(hpu_grads, cpu_grads):
        torch.testing.assert_close(a, b, **_tolerance(precision))


def test_fabric_clip_gradients_by_another_norm_goes_to_torch(fused_clips):
    norms = {}
    for accelerator in ("hpu", "cpu"):
        fabric, model, optimizer = _fabric_gradients(accelerator, "32-true")
        norms[accelerator] = fabric.clip_gradients(model, optimizer, max_norm=MAX_NORM, norm_type="inf")
    assert fused_clips == []
    torch.testing.assert_close(norms["hpu"].cpu(), norms["cpu"])


def test_fabric_clip_gradients_refuses_a_non_finite_norm_unless_told(fused_clips):
    fabric, model, optimizer = _fabric_gradients("hpu", "32-true")
    with torch.no_grad():
        next(model.parameters()).grad[0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="error_if_nonfinite=False"):
        fabric.clip_gradients(model, optimizer, max_norm=MAX_NORM)
    assert fabric.clip_gradients(model, optimizer, max_norm=MAX_NORM, error_if_nonfinite=False).isnan()
    assert len(fused_clips) == 2
