"""lightning-habana's ``examples/fabric/image_classifier/train_fabric.py``, reduced: a convolutional digit classifier
trained with ``lightning.fabric.Fabric(accelerator=HPUAccelerator(), devices=1, strategy=SingleHPUStrategy())``,
``setup_dataloaders``, ``setup``, ``backward``, Adadelta with a ``StepLR`` schedule, a torchmetrics ``Accuracy`` on
the Fabric's device, ``rank_zero_first`` around the data and ``all_gather`` of the test loss; the example's flags
(``--batch-size``, ``--epochs``, ``--lr``, ``--gamma``, ``--dry-run``, ``--seed``, ``--log-interval``,
``--save-model``).

Only the imports of ``lightning_habana`` changed (``lightning_fabric.accelerators`` and ``lightning_fabric.strategies``)
and the data: generated images (``--train-size``, ``--test-size``) in place of torchvision's MNIST download.

The example runs on one HPU. ``--devices N`` (added here) runs it on N HPUs the way Fabric does that: a parallel HPU
strategy and ``fabric.launch()``, which starts the other processes.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from _support import digit_images, report
from lightning.fabric import Fabric, seed_everything
from torch.optim.lr_scheduler import StepLR
from torchmetrics.classification import Accuracy

from lightning_fabric.accelerators import HPUAccelerator
from lightning_fabric.strategies import HPUDDPStrategy, SingleHPUStrategy


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))))
        return F.log_softmax(self.fc2(x), dim=1)


def run(hparams, parallel_strategy=HPUDDPStrategy):
    if hparams.devices > 1:
        fabric = Fabric(accelerator=HPUAccelerator(), devices=hparams.devices, strategy=parallel_strategy())
        fabric.launch()
    else:
        fabric = Fabric(accelerator=HPUAccelerator(), devices=1, strategy=SingleHPUStrategy())
    seed_everything(hparams.seed)

    with fabric.rank_zero_first(local=False):
        train_dataset = digit_images(hparams.train_size, seed=0)
        test_dataset = digit_images(hparams.test_size, seed=1)
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=hparams.batch_size)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=hparams.batch_size)
    train_loader, test_loader = fabric.setup_dataloaders(train_loader, test_loader)

    model = Net()
    optimizer = optim.Adadelta(model.parameters(), lr=hparams.lr)
    model, optimizer = fabric.setup(model, optimizer)
    scheduler = StepLR(optimizer, step_size=1, gamma=hparams.gamma)
    test_acc = Accuracy(task="multiclass", num_classes=10).to(fabric.device)

    observed = {"train_losses": [], "test_losses": [], "test_accuracies": []}
    for epoch in range(1, hparams.epochs + 1):
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            fabric.backward(loss)
            optimizer.step()
            observed["train_losses"].append(loss.item())
            observed["data_device"] = str(data.device)
            if batch_idx == 0 or (batch_idx + 1) % hparams.log_interval == 0:
                done = 100.0 * batch_idx / len(train_loader)
                print(
                    f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)} ({done:.0f}%)]"
                    f"\tLoss: {loss.item():.6f}"
                )
                if hparams.dry_run:
                    break
        scheduler.step()

        model.eval()
        test_loss = 0
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                test_acc(output, target)
                if hparams.dry_run:
                    break
        # every rank tested its part of the data: their sums add up to the loss of the whole test set
        test_loss = fabric.all_gather(test_loss).sum() / len(test_loader.dataset)
        accuracy = test_acc.compute()
        print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: ({100 * accuracy:.0f}%)\n")
        observed["test_losses"].append(test_loss.item())
        observed["test_accuracies"].append(accuracy.item())
        test_acc.reset()
        if hparams.dry_run:
            break

    if hparams.save_model:
        fabric.save(model.state_dict(), "mnist_cnn.pt")

    report(
        example="fabric_train",
        accelerator=type(fabric.accelerator).__name__,
        strategy=type(fabric.strategy).__name__,
        world_size=fabric.world_size,
        device=str(fabric.device),
        param_device=str(next(model.parameters()).device),
        weight_sum=sum(parameter.detach().float().sum().item() for parameter in model.parameters()),
        **observed,
    )


def parse_args():
    parser = argparse.ArgumentParser(description="Fabric MNIST Example on HPU, reduced")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N", help="input batch size for training")
    parser.add_argument("--epochs", type=int, default=14, metavar="N", help="number of epochs to train")
    parser.add_argument("--lr", type=float, default=1.0, metavar="LR", help="learning rate")
    parser.add_argument("--gamma", type=float, default=0.7, metavar="M", help="learning rate step gamma")
    parser.add_argument("--dry-run", action="store_true", default=False, help="quickly check a single pass")
    parser.add_argument("--seed", type=int, default=1, metavar="S", help="random seed")
    parser.add_argument("--log-interval", type=int, default=10, metavar="N", help="batches between log lines")
    parser.add_argument("--save-model", action="store_true", default=False, help="save the trained model")
    # added: the generated data, and more than one HPU
    parser.add_argument("--train-size", type=int, default=1280, help="generated training images")
    parser.add_argument("--test-size", type=int, default=640, help="generated test images")
    parser.add_argument("--devices", type=int, default=1, help="HPUs (the example: 1)")
    return parser.parse_args()


if __name__ == "__main__":
    run(parse_args())
