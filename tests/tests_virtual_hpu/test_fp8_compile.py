"""``torch.compile(backend="hpu_backend")`` of Transformer Engine modules on the virtual Gaudi, in eager mode."""

import copy

import pytest
import torch
from habana_frameworks.torch.hpex.experimental import transformer_engine as te
from habana_frameworks.torch.hpex.experimental.transformer_engine import recipe
from habana_frameworks.torch.hpu.metrics import metric_global
from torch import nn

from virtual_hpu import compilation

pytestmark = pytest.mark.usefixtures("fresh_compilation_state")
HYBRID = recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID)


def _compilations() -> int:
    return dict(metric_global("graph_compilation").stats())["TotalNumber"]


@pytest.mark.parametrize("hpu_mode", ["eager"])
@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_compiled_linear_matches_eager(hpu_mode, grad):
    """Odd sizes, far from multiples of 16, and a 3-D input."""
    torch.manual_seed(0)
    eager = te.Linear(33, 7)
    compiled = copy.deepcopy(eager)
    x = torch.randn(2, 5, 33, device="hpu")
    outputs = []
    for module in (eager, torch.compile(compiled, backend="hpu_backend")):
        with torch.set_grad_enabled(grad):
            for _ in range(2):  # the second step casts with the scales the first one measured
                with te.fp8_autocast(enabled=True, fp8_recipe=HYBRID):
                    out = module(x)
                if grad:
                    out.float().square().sum().backward()
        outputs.append(out)
    assert outputs[1].dtype == torch.bfloat16 and outputs[1].shape == (2, 5, 7)
    torch.testing.assert_close(outputs[1], outputs[0])
    torch.testing.assert_close(compiled.state_dict(), eager.state_dict())  # the fp8 scaling state too
    if grad:
        torch.testing.assert_close(compiled.weight.grad, eager.weight.grad)
        torch.testing.assert_close(compiled.bias.grad, eager.bias.grad)
    assert _compilations() == (2 if grad else 1)  # forward (and backward), compiled once
    assert compilation.graph_breaks() == 0


def _train(model: nn.Module, fp8_recipe: recipe.DelayedScaling, optimizer: str, steps: int, warm_up: int):
    """The loss of each step, and how many graphs were compiled after the warm-up steps (the compilation metrics
    count from there)."""
    optimizers = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), "adam": lambda p: torch.optim.Adam(p)}
    opt = optimizers[optimizer](model.parameters())
    torch.manual_seed(1)
    target = torch.randn(13, 5, device="hpu")
    losses = []
    for step in range(steps):
        if step == warm_up:
            metric_global("graph_compilation").reset()
        x = torch.randn(11, 13, device="hpu")
        with te.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe):
            out = model(x)
        loss = (out.float() - x @ target).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return torch.stack(losses).cpu(), _compilations()


@pytest.mark.parametrize("hpu_mode", ["eager"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize(
    "fp8_recipe",
    [HYBRID, recipe.DelayedScaling(margin=1, interval=2, amax_history_len=4, amax_compute_algo="max")],
    ids=["hybrid", "e5m2-history"],
)
def test_compiled_fp8_training_matches_eager_without_recompiling(hpu_mode, optimizer, fp8_recipe):
    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(te.Linear(13, 37), nn.GELU(), te.Linear(37, 37), nn.ReLU(), te.Linear(37, 5))

    eager_losses, _ = _train(model(), fp8_recipe, optimizer, steps=8, warm_up=2)
    compiled_model = model()
    compiled_losses, recompilations = _train(
        torch.compile(compiled_model, backend="hpu_backend"), fp8_recipe, optimizer, steps=8, warm_up=2
    )
    torch.testing.assert_close(compiled_losses, eager_losses, rtol=1e-4, atol=1e-5)
    assert eager_losses[-3:].mean() < eager_losses[:3].mean()  # it learns
    # after the warm-up (where a longer amax history is made, outside the graphs) nothing is compiled or split again
    assert recompilations == 0
    assert compilation.graph_breaks() == 0
    assert compiled_model[0].fp8_state.steps.item() == 7  # each step closes the one before
