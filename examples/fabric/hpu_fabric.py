"""Train the demo's digit classifier with Lightning Fabric on Intel Gaudi (HPU): 2 HPUs, bf16, data parallel.

Of Lightning, the script imports only ``lightning``, as any Fabric script does: with a Gaudi present,
``Fabric(accelerator="auto")`` picks the HPUs and ``devices=2`` runs DDP over HCCL. The data is scikit-learn's copy of
the UCI handwritten digits, so nothing is downloaded. On a machine without Gaudi, run it on the virtual Gaudi::

    VIRTUAL_HPU=1 python examples/fabric/hpu_fabric.py                          # fabric.launch() starts rank 1
    VIRTUAL_HPU=1 torchrun --nproc_per_node=2 examples/fabric/hpu_fabric.py     # torchrun starts both ranks

``--strategy deepspeed`` trains it with DeepSpeed (ZeRO stage 2) instead. ``PT_HPU_LAZY_MODE=1`` selects Gaudi's legacy
lazy mode, where Fabric's HPU strategy cuts the graph after the backward pass and after the optimizer step.
"""

from argparse import ArgumentParser

import lightning as L
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split


def digits() -> list:
    """Scikit-learn's handwritten digits, scaled to [0, 1] and split 70/15/15 with a fixed seed, as in the demo."""
    images, labels = load_digits(return_X_y=True)
    dataset = TensorDataset(torch.tensor(images / 16.0, dtype=torch.float32).view(-1, 1, 8, 8), torch.tensor(labels))
    return random_split(dataset, [0.7, 0.15, 0.15], generator=torch.Generator().manual_seed(0))


def classifier() -> nn.Module:
    """The demo's small convolutional network for 8x8 digit images."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 4 * 4, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


@torch.no_grad()
def evaluate(fabric: L.Fabric, model: nn.Module, loader: DataLoader) -> tuple:
    """Loss and accuracy over the whole split: each rank sums over its share, then the sums are added up.

    The DistributedSampler pads a split to a multiple of the number of ranks, so an example or two may count twice.
    """
    totals = torch.zeros(3, device=fabric.device)  # summed loss, correct predictions, examples
    for images, labels in loader:
        logits = model(images)
        totals[0] += F.cross_entropy(logits, labels, reduction="sum")
        totals[1] += (logits.argmax(-1) == labels).sum()
        totals[2] += len(labels)
    loss, correct, count = fabric.all_reduce(totals, reduce_op="sum").tolist()
    return loss / count, correct / count


def train(fabric: L.Fabric, args) -> None:
    fabric.seed_everything(42)
    train_set, val_set, test_set = digits()
    # a ragged last batch would be a new shape, compiled anew, at the end of every epoch
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True, drop_last=True)
    # each rank gets a DistributedSampler over its share of every split; Fabric reshuffles the training split each epoch
    train_loader, val_loader, test_loader = fabric.setup_dataloaders(
        train_loader, DataLoader(val_set, batch_size=256), DataLoader(test_set, batch_size=256)
    )
    model = classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer = fabric.setup(model, optimizer)

    for epoch in range(args.epochs):
        model.train()
        # summed on the device and read once an epoch: a loss read every step would be a host sync every step
        train_loss = torch.zeros((), device=fabric.device)
        for images, labels in train_loader:
            loss = F.cross_entropy(model(images), labels)
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            train_loss += loss.detach()
        train_loss = fabric.all_reduce(train_loss / len(train_loader), reduce_op="mean")
        model.eval()
        val_loss, val_acc = evaluate(fabric, model, val_loader)
        fabric.print(f"epoch {epoch}: train_loss={float(train_loss):.4f} val_loss={val_loss:.4f} val_acc={val_acc:.4f}")

    test_loss, test_acc = evaluate(fabric, model, test_loader)
    accelerator = type(fabric.accelerator).__name__
    fabric.print(
        f"final metrics on {fabric.world_size} x {accelerator}: test_acc={test_acc:.4f}, test_loss={test_loss:.4f}"
    )


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="auto", help="'hpu', 'cpu' or 'auto' (HPU when present)")
    parser.add_argument("--devices", default="2", help="number of devices, or 'auto'")
    parser.add_argument("--strategy", default="auto", help="e.g. 'ddp' (DDP over HCCL on HPUs) or 'deepspeed'")
    parser.add_argument("--precision", default="bf16-mixed", help="'bf16-mixed', '32-true', 'bf16-true', ...")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    args = parser.parse_args()

    devices = args.devices if args.devices == "auto" else int(args.devices)
    fabric = L.Fabric(accelerator=args.accelerator, devices=devices, strategy=args.strategy, precision=args.precision)
    # started as `python`, this starts the other processes; started by torchrun, each process is already one rank
    fabric.launch(train, args)


if __name__ == "__main__":
    main()
