"""What the reduced lightning-habana examples of this folder share: generated data in place of the downloads (MNIST,
WikiText-2) and the report lines the tests read.

Nothing here is downloaded: the images are noisy copies of ten fixed random 28x28 patterns, one per class, which a
linear layer separates after a few steps; the text is a stream of tokens in which each token is mostly followed by
one fixed successor.
"""

import json
import os
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from lightning_utilities import module_available
from torch.utils.data import DataLoader, Dataset, TensorDataset

# the examples import ``lightning`` when it is installed and ``pytorch_lightning`` otherwise
if module_available("lightning"):
    from lightning.pytorch import LightningDataModule
else:
    from pytorch_lightning import LightningDataModule

REPORT = "LH_REPORT "
_STARTED = time.time()


def report(**fields: Any) -> None:
    """One line the tests parse: ``LH_REPORT {json}``, with the rank and the cards this process was given."""
    fields.setdefault("rank", int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))))
    fields.setdefault("visible_modules", os.environ.get("HABANA_VISIBLE_MODULES"))
    fields.setdefault("module_id", os.environ.get("HLS_MODULE_ID"))
    fields.setdefault("pid", os.getpid())
    fields.update(started=_STARTED, reported=time.time())
    # one write: the ranks of a run share the console, and a line written in pieces could be cut by another's
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (REPORT + json.dumps(fields, default=str) + "\n").encode())


def digit_images(count: int, seed: int) -> TensorDataset:
    """``count`` 1x28x28 images and their labels (0 to 9): each image is its class's pattern plus noise, as a
    normalised MNIST image would be fed to the examples' models."""
    patterns = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(1234))
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (count,), generator=generator)
    images = patterns[labels] + 1.0 * torch.randn(count, 1, 28, 28, generator=generator)
    return TensorDataset(images, labels)


class DigitsDataModule(LightningDataModule):
    """In place of ``MNISTDataModule(batch_size=..., num_workers=...)``: the same splits and loaders (training
    batches shuffled, every loader drops its last incomplete batch), on generated images. The images are in memory
    already: unless asked for, no worker processes (``MNISTDataModule`` starts 16 by default, which on a small
    machine takes longer than the runs here)."""

    def __init__(self, batch_size: int = 32, num_workers: int = 0, train: int = 2000, val: int = 600, test: int = 600):
        super().__init__()
        self.batch_size, self.num_workers = batch_size, num_workers
        self.sizes = {"train": train, "val": val, "test": test}

    def setup(self, stage: str) -> None:
        self.datasets = {split: digit_images(size, seed) for seed, (split, size) in enumerate(self.sizes.items())}

    def _loader(self, split: str) -> DataLoader:
        return DataLoader(
            self.datasets[split],
            batch_size=self.batch_size,
            shuffle=split == "train",
            num_workers=self.num_workers,
            drop_last=True,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")


class TokenStream(Dataset):
    """In place of ``WikiText2()``: ``(input, target)`` blocks of ``block_size`` tokens, the target shifted by one,
    and ``vocab_size``; nine tokens in ten follow their predecessor's fixed successor."""

    def __init__(self, vocab: int = 64, tokens: int = 4000, block_size: int = 35, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        successor = torch.randperm(vocab, generator=generator)
        jumps = torch.rand(tokens, generator=generator) < 0.1
        random_tokens = torch.randint(0, vocab, (tokens,), generator=generator)
        stream = [0]
        for index in range(1, tokens):
            stream.append(int(random_tokens[index]) if jumps[index] else int(successor[stream[-1]]))
        self.data = torch.tensor(stream)
        self.block_size, self._vocab = block_size, vocab

    @property
    def vocab_size(self) -> int:
        return self._vocab

    def __len__(self) -> int:
        return len(self.data) // self.block_size - 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.block_size
        return self.data[start : start + self.block_size], self.data[start + 1 : start + self.block_size + 1]


@contextmanager
def counting_hpu_graphs() -> Iterator[dict[str, int]]:
    """Count the captures and replays of every ``HPUGraph`` (those ``make_graphed_callables``, ``ModuleCacher`` and
    ``wrap_in_hpu_graph`` build included) while the block runs."""
    import habana_frameworks.torch.hpu as hthpu

    counts = {"captures": 0, "replays": 0}
    graph_class = hthpu.HPUGraph
    capture_end, replay = graph_class.capture_end, graph_class.replay

    def counted_capture_end(graph: Any, *args: Any, **kwargs: Any) -> Any:
        counts["captures"] += 1
        return capture_end(graph, *args, **kwargs)

    def counted_replay(graph: Any, *args: Any, **kwargs: Any) -> Any:
        counts["replays"] += 1
        return replay(graph, *args, **kwargs)

    graph_class.capture_end, graph_class.replay = counted_capture_end, counted_replay
    try:
        yield counts
    finally:
        graph_class.capture_end, graph_class.replay = capture_end, replay
