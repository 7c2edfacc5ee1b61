"""Training on hpu gives bit-identical results to the same training on cpu."""

import pytest
import torch
from torch import nn


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(784, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10))


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 4, 3, padding=1),
        nn.Flatten(),
        nn.Linear(4 * 13 * 13, 10),
    )


def _train(device: str, make_model, shape, optimizer_cls, steps: int = 3):
    torch.manual_seed(0)
    model = make_model().to(device)
    x = torch.randn(16, *shape).to(device)
    y = torch.randint(0, 10, (16,)).to(device)
    optimizer = optimizer_cls(model.parameters(), lr=0.01 if optimizer_cls is torch.optim.SGD else 1e-3)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}, model


@pytest.mark.parametrize("optimizer_cls", [torch.optim.SGD, torch.optim.AdamW], ids=["sgd", "adamw"])
@pytest.mark.parametrize(("make_model", "shape"), [(_mlp, (784,)), (_cnn, (1, 28, 28))], ids=["mlp", "cnn"])
def test_training_matches_cpu_exactly(make_model, shape, optimizer_cls):
    cpu_losses, cpu_state, _ = _train("cpu", make_model, shape, optimizer_cls)
    hpu_losses, hpu_state, model = _train("hpu", make_model, shape, optimizer_cls)
    assert all(p.device.type == "hpu" for p in model.parameters())
    assert hpu_losses == cpu_losses
    assert cpu_losses[-1] < cpu_losses[0]
    for name, value in cpu_state.items():
        assert torch.equal(hpu_state[name], value), name
