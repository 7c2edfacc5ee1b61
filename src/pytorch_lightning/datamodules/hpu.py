"""ImageNet-style image classification data for HPU training: lightning-habana's ``HPUDataModule``."""

import functools
import importlib.util
import math
import os
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any, Callable, Optional, Union

import torch
import torch.nn.functional as F
from lightning.pytorch.core.datamodule import LightningDataModule
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler, Sampler, SequentialSampler
from typing_extensions import override

from pytorch_lightning.accelerators.hpu import HPUAccelerator

_DATASETS_PATH = "/tmp/data"

# ResNet's ImageNet recipe, the one Intel's media loader runs on the device
_CROP_SIZE = 224
_RESIZE_SIZE = 256
_CROP_SCALE = (0.08, 1.0)
_CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)
_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)
# the files torchvision's ImageFolder reads
_IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

_Transforms = Union[Sequence[Callable], Callable, None]


class HPUDataModule(LightningDataModule):
    """Image classification data in ImageNet's folder layout, with ResNet's transforms: lightning-habana's
    ``HPUDataModule``, with the same constructor.

    ``train_dir`` and ``val_dir`` hold one sub-folder per class, named after it (the layout of torchvision's
    ``ImageFolder``); labels number the class folders in sorted order. The validation folder also serves the test
    loader. Each batch is ``(images, labels)``: ``float32`` images of shape ``(batch_size, 3, 224, 224)`` (RGB,
    normalized with ImageNet's mean and standard deviation) and ``int64`` labels of shape ``(batch_size,)``.

    Unless you pass your own transforms, training images are cropped at random (8 % to 100 % of the area, aspect
    ratio 3:4 to 4:3), resized to 224 x 224 and flipped horizontally with probability 1/2; validation and test images
    are resized to a shorter side of 256 and center-cropped to 224 x 224.

    :attr:`pipeline` says where the batches are made:

    - ``"media"``: on a Gaudi with Intel's media loader installed (``habana_frameworks.mediapipe`` and its PyTorch
      entry point ``habana_dataloader``), Intel's ``HabanaDataLoader`` reads the folders; on Gaudi2 and newer it
      decodes and transforms JPEG images on the device.
    - ``"torchvision"``: elsewhere, where torchvision imports, images are decoded with Pillow and transformed with
      torchvision's transforms in ``num_workers`` host processes.
    - ``"torch"``: where torchvision does not import (no build matching the installed torch), the same transforms
      written with torch ops, with the same batch layout.

    Args:
        train_dir: the training folder.
        val_dir: the validation folder, also used for testing.
        num_workers: host worker processes of each loader (Intel's loader manages its own).
        normalize: has no effect, as in lightning-habana: batches are always normalized (pass transforms for other
            statistics).
        seed: seed of the order of the training samples.
        batch_size: samples per batch.
        train_transforms: transforms of training images, in place of the default ones: a list applied in order, or
            one callable. They get an RGB ``PIL.Image``; the last one returns a tensor. With torchvision, the list
            becomes a ``torchvision.transforms.Compose``, which Intel's media loader translates to device operations.
        val_transforms: the same for validation and test images.
        pin_memory: whether the loaders put batches in page-locked host memory, for faster copies to the device.
        shuffle: must be ``False``: training samples are always drawn in random order and validation and test samples
            in folder order (lightning-habana refused ``True`` too).
        drop_last: whether each loader, validation and test included, drops its last incomplete batch.
        distributed: whether the loaders sample only this process's share of the data themselves. Under a
            multi-device strategy the ``Trainer`` does this anyway for the host pipelines; Intel's loader always does.
    """

    name = "hpu-dataset"

    def __init__(
        self,
        train_dir: str = _DATASETS_PATH,
        val_dir: str = _DATASETS_PATH,
        num_workers: int = 8,
        normalize: bool = False,
        seed: int = 42,
        batch_size: int = 32,
        train_transforms: _Transforms = None,
        val_transforms: _Transforms = None,
        pin_memory: bool = True,
        shuffle: bool = False,
        drop_last: bool = True,
        distributed: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if shuffle:
            raise ValueError(
                "`HPUDataModule(shuffle=True)` is not supported: training samples are always drawn in random order"
                " (seeded by `seed`) and validation and test samples in folder order. Leave `shuffle=False`."
            )
        self.train_dir = train_dir
        self.val_dir = val_dir
        self.num_workers = num_workers
        self.normalize = normalize
        self.seed = seed
        self.batch_size = batch_size
        self.train_transform = train_transforms
        self.val_transform = val_transforms
        self.pin_memory = pin_memory
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.distributed = distributed

    @property
    def pipeline(self) -> str:
        """``"media"``, ``"torchvision"`` or ``"torch"``: who makes the batches in this process (see the class)."""
        if _media_loader_available():
            return "media"
        return "torch" if _torchvision() is None else "torchvision"

    @override
    def setup(self, stage: Optional[str] = None) -> None:
        """Scans the folders the stage needs: both for ``"fit"`` (or no stage), the validation folder otherwise."""
        rank_zero_info(f"HPUDataModule: batches made by the {_PIPELINE_DESCRIPTIONS[self.pipeline]}")
        if stage in (None, "fit"):
            self.dataset_train = self._dataset(self.train_dir, train=True)
        self.dataset_val = self._dataset(self.val_dir, train=False)
        if stage in (None, "fit"):
            _check_same_classes(self.dataset_train, self.train_dir, self.dataset_val, self.val_dir)

    @override
    def train_dataloader(self) -> Iterable:
        return self._loader(self.dataset_train, train=True)

    @override
    def val_dataloader(self) -> Iterable:
        return self._loader(self.dataset_val, train=False)

    @override
    def test_dataloader(self) -> Iterable:
        return self._loader(self.dataset_val, train=False)

    def _dataset(self, root: str, train: bool) -> Dataset:
        given = self.train_transform if train else self.val_transform
        torchvision = _torchvision()
        if torchvision is None:
            if given is None:
                transform: Callable = _ResNetTrainTransform() if train else _ResNetEvalTransform()
            else:
                transform = _Compose(given) if isinstance(given, (list, tuple)) else given
            return _ImageFolder(root, transform)
        if given is None:
            given = _torchvision_resnet_transforms(torchvision, train)
        if isinstance(given, (list, tuple)):
            given = torchvision.transforms.Compose(list(given))
        return torchvision.datasets.ImageFolder(root, given)

    def _loader(self, dataset: Dataset, train: bool) -> Iterable:
        if _media_loader_available():
            import habana_dataloader

            # Intel's loader shuffles only for a shuffling DistributedSampler, and slices the data by rank itself
            return habana_dataloader.HabanaDataLoader(
                dataset=dataset,
                batch_size=self.batch_size,
                sampler=self._distributed_sampler(dataset, train),
                num_workers=self.num_workers,
                pin_memory=self.pin_memory,
                drop_last=self.drop_last,
            )
        sampler: Sampler
        if self.distributed:
            sampler = self._distributed_sampler(dataset, train)
        elif train:
            sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(self.seed))
        else:
            sampler = SequentialSampler(dataset)
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            drop_last=self.drop_last,
        )

    def _distributed_sampler(self, dataset: Dataset, train: bool) -> DistributedSampler:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        return DistributedSampler(
            dataset,
            num_replicas=torch.distributed.get_world_size() if distributed else 1,
            rank=torch.distributed.get_rank() if distributed else 0,
            shuffle=train,
            seed=self.seed,
        )


_PIPELINE_DESCRIPTIONS = {
    "media": "Intel media loader (HabanaDataLoader)",
    "torchvision": "host with Pillow and torchvision's transforms",
    "torch": "host with Pillow and torch ops (torchvision does not import)",
}


@functools.cache
def _torchvision() -> Optional[ModuleType]:
    """torchvision, if it imports with the installed torch; a build for another torch fails while importing (its
    operators do not register), and then the data module does without it."""
    if importlib.util.find_spec("torchvision") is None:
        return None
    try:
        import torchvision
        import torchvision.datasets
        import torchvision.transforms
    except Exception:
        return None
    return torchvision


def _media_loader_available() -> bool:
    """Whether Intel's media loader can make the batches: a real Gaudi (the virtual one has no media engine), the
    loader's packages, and torchvision, whose dataset and transforms the loader reads."""
    if not HPUAccelerator.is_available() or HPUAccelerator.is_virtual():
        return False
    try:
        found = all(
            importlib.util.find_spec(name) is not None for name in ("habana_frameworks.mediapipe", "habana_dataloader")
        )
    except ImportError:
        return False
    return found and _torchvision() is not None


def _torchvision_resnet_transforms(torchvision: ModuleType, train: bool) -> list:
    transforms = torchvision.transforms
    if train:
        crop = [transforms.RandomResizedCrop(_CROP_SIZE), transforms.RandomHorizontalFlip()]
    else:
        crop = [transforms.Resize(_RESIZE_SIZE), transforms.CenterCrop(_CROP_SIZE)]
    return [*crop, transforms.ToTensor(), transforms.Normalize(_MEAN, _STD)]


def _check_same_classes(train: Any, train_dir: str, val: Any, val_dir: str) -> None:
    if train.classes == val.classes:
        return
    only_train = sorted(set(train.classes) - set(val.classes))[:5]
    only_val = sorted(set(val.classes) - set(train.classes))[:5]
    raise ValueError(
        f"The class folders of `train_dir={train_dir!r}` and `val_dir={val_dir!r}` differ (only in train_dir:"
        f" {only_train}, only in val_dir: {only_val}), so the same label would name different classes. Give both"
        " folders the same class sub-folders."
    )


class _ImageFolder(Dataset):
    """torchvision's ``ImageFolder`` without torchvision: the same layout, order of samples and attributes
    (``classes``, ``class_to_idx``, ``samples``, ``targets``); images are decoded with Pillow, as RGB."""

    def __init__(self, root: str, transform: Callable) -> None:
        self.root = root
        self.transform = transform
        try:
            self.classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
        except FileNotFoundError:
            raise FileNotFoundError(f"The image folder {root!r} does not exist.") from None
        if not self.classes:
            raise FileNotFoundError(f"{root!r} has no class folders: expected {root}/<class>/<image>.")
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}
        self.samples: list[tuple[str, int]] = []
        empty = []
        for name in self.classes:
            found = [
                os.path.join(folder, file)
                for folder, _, files in sorted(os.walk(os.path.join(root, name), followlinks=True))
                for file in sorted(files)
                if file.lower().endswith(_IMAGE_EXTENSIONS)
            ]
            if not found:
                empty.append(name)
            self.samples.extend((path, self.class_to_idx[name]) for path in found)
        if empty:
            raise FileNotFoundError(
                f"The class folders {empty} of {root!r} hold no image ({', '.join(_IMAGE_EXTENSIONS)})."
            )
        self.targets = [target for _, target in self.samples]
        self.imgs = self.samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        from PIL import Image

        path, target = self.samples[index]
        with open(path, "rb") as file:
            image = Image.open(file).convert("RGB")
        return self.transform(image), target


class _Compose:
    """Applies transforms in order (picklable, for worker processes)."""

    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = list(transforms)

    def __call__(self, image: Any) -> Any:
        for transform in self.transforms:
            image = transform(image)
        return image


class _ResNetTrainTransform:
    """torchvision's ``RandomResizedCrop(224)``, ``RandomHorizontalFlip()``, ``ToTensor()`` and ``Normalize`` with
    ImageNet's statistics, written with torch ops. Draws from torch's random generator, as torchvision does."""

    def __call__(self, image: Any) -> torch.Tensor:
        pixels = _to_tensor(image)
        top, left, height, width = _random_crop_box(pixels.shape[1], pixels.shape[2])
        crop = _resize(pixels[:, top : top + height, left : left + width].float(), (_CROP_SIZE, _CROP_SIZE))
        if torch.rand(()) < 0.5:
            crop = crop.flip(-1)
        return _normalize(crop)


class _ResNetEvalTransform:
    """torchvision's ``Resize(256)``, ``CenterCrop(224)``, ``ToTensor()`` and ``Normalize`` with ImageNet's
    statistics, written with torch ops."""

    def __call__(self, image: Any) -> torch.Tensor:
        pixels = _to_tensor(image).float()
        height, width = pixels.shape[1:]
        # the shorter side becomes 256, the longer one keeps the aspect ratio (rounded down)
        if height <= width:
            size = (_RESIZE_SIZE, int(_RESIZE_SIZE * width / height))
        else:
            size = (int(_RESIZE_SIZE * height / width), _RESIZE_SIZE)
        resized = _resize(pixels, size)
        top = int(round((size[0] - _CROP_SIZE) / 2.0))
        left = int(round((size[1] - _CROP_SIZE) / 2.0))
        return _normalize(resized[:, top : top + _CROP_SIZE, left : left + _CROP_SIZE])


def _to_tensor(image: Any) -> torch.Tensor:
    """An RGB ``PIL.Image`` as a ``uint8`` tensor of shape ``(3, height, width)``."""
    width, height = image.size
    pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
    return pixels.view(height, width, 3).permute(2, 0, 1)


def _random_crop_box(height: int, width: int) -> tuple[int, int, int, int]:
    """``(top, left, height, width)`` of a crop as ``RandomResizedCrop`` draws it: an area of 8 % to 100 % of the
    image's and an aspect ratio drawn log-uniformly from 3:4 to 4:3, at a random place. If ten draws do not fit in the
    image, the whole image, or its largest central part whose aspect ratio is within those bounds."""
    area = height * width
    log_ratios = (math.log(_CROP_RATIO[0]), math.log(_CROP_RATIO[1]))
    for _ in range(10):
        crop_area = area * torch.empty(()).uniform_(*_CROP_SCALE).item()
        ratio = math.exp(torch.empty(()).uniform_(*log_ratios).item())
        crop_width = int(round(math.sqrt(crop_area * ratio)))
        crop_height = int(round(math.sqrt(crop_area / ratio)))
        if 0 < crop_width <= width and 0 < crop_height <= height:
            top = int(torch.randint(0, height - crop_height + 1, ()).item())
            left = int(torch.randint(0, width - crop_width + 1, ()).item())
            return top, left, crop_height, crop_width
    ratio = width / height
    if ratio < _CROP_RATIO[0]:
        crop_width, crop_height = width, int(round(width / _CROP_RATIO[0]))
    elif ratio > _CROP_RATIO[1]:
        crop_width, crop_height = int(round(height * _CROP_RATIO[1])), height
    else:
        crop_width, crop_height = width, height
    return (height - crop_height) // 2, (width - crop_width) // 2, crop_height, crop_width


def _resize(pixels: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bilinear resize with antialiasing (as Pillow's) of a ``(3, height, width)`` image of values 0-255, rounded to
    whole values as the 8-bit image of torchvision's pipeline is."""
    resized = F.interpolate(pixels[None], size=size, mode="bilinear", align_corners=False, antialias=True)[0]
    return resized.round_().clamp_(0, 255)


def _normalize(pixels: torch.Tensor) -> torch.Tensor:
    """Values 0-255 to ``ToTensor()`` and ``Normalize(mean, std)``'s: ``(pixels / 255 - mean) / std``."""
    mean = torch.tensor(_MEAN).view(3, 1, 1)
    std = torch.tensor(_STD).view(3, 1, 1)
    return (pixels / 255 - mean) / std
