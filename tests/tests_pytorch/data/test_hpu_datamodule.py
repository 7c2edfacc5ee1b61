"""``HPUDataModule`` on small generated image folders, on the host pipeline the virtual Gaudi uses.

The virtual Gaudi has no media engine, so Intel's media loader is never used here. These tests force the torch-ops
pipeline (as if torchvision did not import), so that they check our transforms also where torchvision is installed;
the reference for those transforms is what torchvision computes on a ``PIL.Image``: Pillow's bilinear resize (with
antialiasing), crops at the same places, ``ToTensor`` and ``Normalize``.
"""

import inspect
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch import LightningDataModule
from PIL import Image
from torch import nn
from torch.utils.data import DistributedSampler

import pytorch_lightning as pl
from pytorch_lightning.datamodules import HPUDataModule
from pytorch_lightning.datamodules import hpu as hpu_datamodule

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
# (width, height): upscaled and downscaled, landscape and portrait
SIZES = [(64, 48), (48, 80), (520, 400)]


@pytest.fixture(autouse=True)
def torch_ops_pipeline(monkeypatch):
    monkeypatch.setattr(hpu_datamodule, "_torchvision", lambda: None)


def _noise(width: int, height: int, seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _image_folder(root: Path, classes=("cat", "dog"), sizes=SIZES) -> Path:
    for label, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for index, (width, height) in enumerate(sizes):
            _noise(width, height, seed=100 * label + index).save(root / name / f"{index}.png")
    (root / classes[0] / "notes.txt").write_text("not an image")
    return root


@pytest.fixture
def folders(tmp_path):
    return str(_image_folder(tmp_path / "train")), str(_image_folder(tmp_path / "val"))


def _pixels(image: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float()


def _unnormalize(batch: torch.Tensor) -> torch.Tensor:
    return batch * STD * 255 + MEAN * 255


def _assert_close_to(ours: torch.Tensor, reference: torch.Tensor) -> None:
    # Pillow rounds to 8 bits after each of its two resize passes, we once: at most one level apart
    difference = (_unnormalize(ours) - reference).abs()
    assert difference.max() <= 1.001
    assert difference.mean() < 0.35


def test_constructor_is_lightning_habanas():
    parameters = inspect.signature(HPUDataModule.__init__).parameters
    defaults = {name: p.default for name, p in parameters.items() if p.default is not inspect.Parameter.empty}
    assert list(parameters)[1:] == [
        "train_dir",
        "val_dir",
        "num_workers",
        "normalize",
        "seed",
        "batch_size",
        "train_transforms",
        "val_transforms",
        "pin_memory",
        "shuffle",
        "drop_last",
        "distributed",
        "args",
        "kwargs",
    ]
    assert defaults == {
        "train_dir": "/tmp/data",
        "val_dir": "/tmp/data",
        "num_workers": 8,
        "normalize": False,
        "seed": 42,
        "batch_size": 32,
        "train_transforms": None,
        "val_transforms": None,
        "pin_memory": True,
        "shuffle": False,
        "drop_last": True,
        "distributed": False,
    }
    data = HPUDataModule()
    assert isinstance(data, LightningDataModule)
    assert data.name == "hpu-dataset"


def test_shuffle_is_refused():
    with pytest.raises(ValueError, match=r"shuffle=True\)` is not supported.*Leave `shuffle=False`"):
        HPUDataModule(shuffle=True)


def test_pipeline_on_the_virtual_gaudi(monkeypatch):
    assert not hpu_datamodule._media_loader_available()
    assert HPUDataModule().pipeline == "torch"
    monkeypatch.setattr(hpu_datamodule, "_torchvision", lambda: torch)  # any module: "torchvision imports"
    assert HPUDataModule().pipeline == "torchvision"


def test_class_mapping_and_samples(folders):
    data = HPUDataModule(*folders, num_workers=0)
    data.setup("fit")
    for dataset, root in ((data.dataset_train, folders[0]), (data.dataset_val, folders[1])):
        assert dataset.classes == ["cat", "dog"]
        assert dataset.class_to_idx == {"cat": 0, "dog": 1}
        assert [Path(path).relative_to(root).as_posix() for path, _ in dataset.samples] == [
            f"{name}/{index}.png" for name in ("cat", "dog") for index in range(3)
        ]
        assert dataset.targets == [0, 0, 0, 1, 1, 1]
    data = HPUDataModule(*folders, num_workers=0)
    data.setup("validate")
    assert not hasattr(data, "dataset_train")
    assert len(data.dataset_val) == 6


def test_validation_batches(folders):
    data = HPUDataModule(*folders, num_workers=0, batch_size=4, drop_last=False)
    data.setup("fit")
    loader = data.val_dataloader()
    batches = list(loader)
    assert len(loader) == len(batches) == 2
    images = torch.cat([images for images, _ in batches])
    labels = torch.cat([labels for _, labels in batches])
    assert batches[0][0].shape == (4, 3, 224, 224) and batches[1][0].shape == (2, 3, 224, 224)
    assert images.dtype == torch.float32 and labels.dtype == torch.int64
    assert labels.tolist() == [0, 0, 0, 1, 1, 1]  # in folder order
    for image, (path, _) in zip(images, data.dataset_val.samples):
        # torchvision's Resize(256) + CenterCrop(224) on a PIL image
        source = Image.open(path).convert("RGB")
        width, height = source.size
        size = (256, int(256 * height / width)) if width <= height else (int(256 * width / height), 256)
        left, top = int(round((size[0] - 224) / 2)), int(round((size[1] - 224) / 2))
        reference = source.resize(size, Image.BILINEAR).crop((left, top, left + 224, top + 224))
        _assert_close_to(image, _pixels(reference))
    # the normalization is ImageNet's: uniform noise in 0-255 has mean 127.5, so each channel is near (0.5 - m) / s
    noise_means = images.mean(dim=(0, 2, 3))
    assert torch.allclose(noise_means, (0.5 - MEAN.flatten()) / STD.flatten(), atol=0.05)
    # the test loader serves the validation folder
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(data.test_dataloader(), batches, strict=True))


def test_training_transform_against_pillow():
    transform = hpu_datamodule._ResNetTrainTransform()
    flips = []
    for seed in range(24):
        source = _noise(*SIZES[seed % 3], seed=seed)
        torch.manual_seed(seed)
        top, left, height, width = hpu_datamodule._random_crop_box(source.height, source.width)
        flip = bool(torch.rand(()) < 0.5)
        torch.manual_seed(seed)  # the transform draws the same crop and flip
        image = transform(source)
        assert image.shape == (3, 224, 224) and image.dtype == torch.float32
        # torchvision's RandomResizedCrop(224) with that crop, then RandomHorizontalFlip
        reference = source.crop((left, top, left + width, top + height)).resize((224, 224), Image.BILINEAR)
        if flip:
            reference = reference.transpose(Image.FLIP_LEFT_RIGHT)
        _assert_close_to(image, _pixels(reference))
        flips.append(flip)
    assert 4 <= sum(flips) <= 20


def test_random_crop_boxes():
    torch.manual_seed(0)
    height, width = 150, 160
    areas, ratios = [], []
    for _ in range(300):
        top, left, crop_height, crop_width = hpu_datamodule._random_crop_box(height, width)
        assert 0 <= top and top + crop_height <= height and 0 <= left and left + crop_width <= width
        areas.append(crop_height * crop_width / (height * width))
        ratios.append(crop_width / crop_height)
    # the drawn area and aspect ratio, up to rounding the sides to whole pixels
    assert 0.07 <= min(areas) < 0.2 and 0.8 < max(areas) <= 1.0
    assert 0.7 <= min(ratios) < 0.85 and 1.2 < max(ratios) <= 1.4
    assert len({(round(a, 3), round(r, 3)) for a, r in zip(areas, ratios)}) > 250
    # no draw fits in a strip 10 pixels high: its central part of aspect ratio 4:3
    assert hpu_datamodule._random_crop_box(10, 1000) == (0, (1000 - 13) // 2, 10, 13)
    assert hpu_datamodule._random_crop_box(1000, 10) == ((1000 - 13) // 2, 0, 13, 10)


def test_training_order_is_seeded_and_drop_last(folders):
    def order(seed: int, **kwargs) -> list:
        data = HPUDataModule(*folders, num_workers=0, batch_size=4, seed=seed, **kwargs)
        data.setup("fit")
        sampler = data.train_dataloader().sampler
        return [list(sampler), list(sampler)]  # two epochs

    first, second = order(seed=7)
    assert sorted(first) == sorted(second) == list(range(6))
    assert first != second  # a new order every epoch
    assert order(seed=7) == [first, second]
    assert order(seed=8) != [first, second]

    data = HPUDataModule(*folders, num_workers=0, batch_size=4)
    data.setup("fit")
    assert len(data.train_dataloader()) == len(data.val_dataloader()) == 1
    assert [len(images) for images, _ in data.train_dataloader()] == [4]
    data = HPUDataModule(*folders, num_workers=0, batch_size=4, drop_last=False)
    data.setup("fit")
    assert [len(images) for images, _ in data.train_dataloader()] == [4, 2]


def test_distributed_samplers(folders):
    data = HPUDataModule(*folders, num_workers=0, seed=3, distributed=True)
    data.setup("fit")
    train, val = data.train_dataloader().sampler, data.val_dataloader().sampler
    assert isinstance(train, DistributedSampler) and isinstance(val, DistributedSampler)
    assert (train.num_replicas, train.rank, train.shuffle, train.seed) == (1, 0, True, 3)
    assert (val.num_replicas, val.rank, val.shuffle) == (1, 0, False)
    assert list(val) == list(range(6)) and sorted(train) == list(range(6))


class _Shrink:
    def __call__(self, image):
        return image.resize((8, 6))


class _ToTensor:
    def __call__(self, image):
        return _pixels(image) / 255


def test_own_transforms(folders):
    data = HPUDataModule(*folders, num_workers=0, batch_size=6, train_transforms=[_Shrink(), _ToTensor()])
    data.setup("fit")
    images, labels = next(iter(data.train_dataloader()))
    assert images.shape == (6, 3, 6, 8)
    assert 0 <= images.min() and images.max() <= 1
    assert next(iter(data.val_dataloader()))[0].shape == (6, 3, 224, 224)  # default transforms there
    data = HPUDataModule(*folders, num_workers=0, batch_size=6, val_transforms=_ToTensor())
    data.setup("validate")
    assert data.val_dataloader().dataset[0][0].shape == (3, 48, 64)


def test_folder_errors(tmp_path):
    train = str(_image_folder(tmp_path / "train"))
    val = str(_image_folder(tmp_path / "val", classes=("cat", "cow")))
    with pytest.raises(ValueError, match=r"only in train_dir: \['dog'\], only in val_dir: \['cow'\]"):
        HPUDataModule(train, val).setup("fit")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        HPUDataModule(str(tmp_path / "missing"), val).setup("fit")
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    (tmp_path / "empty" / "cat" / "notes.txt").write_text("")
    with pytest.raises(FileNotFoundError, match=r"class folders \['cat'\] .* hold no image"):
        HPUDataModule(val_dir=str(tmp_path / "empty")).setup("validate")
    with pytest.raises(FileNotFoundError, match="has no class folders"):
        HPUDataModule(val_dir=str(tmp_path / "empty" / "cat")).setup("validate")


class _TinyClassifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 4, 8, stride=8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(4, 2)
        self.batches: list = []

    def forward(self, images):
        return self.head(self.net(images))

    def training_step(self, batch, batch_idx):
        images, labels = batch
        self.batches.append(("train", images.device.type, images.dtype, tuple(images.shape), labels.dtype))
        return nn.functional.cross_entropy(self(images), labels)

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        self.batches.append(("val", images.device.type, images.dtype, tuple(images.shape), labels.dtype))
        self.log("val_loss", nn.functional.cross_entropy(self(images), labels))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_fit_on_the_virtual_hpu(folders, tmp_path):
    # a worker process decodes, as with the default 8 workers; 3 + 3 images make 2 batches of 3 an epoch
    data = HPUDataModule(*folders, num_workers=1, batch_size=3)
    model = _TinyClassifier()
    before = [parameter.detach().clone() for parameter in model.parameters()]
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=1,
        max_steps=2,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=data)
    assert trainer.global_step == 2
    batch = ("hpu", torch.float32, (3, 3, 224, 224), torch.int64)
    assert model.batches == [("train", *batch)] * 2 + [("val", *batch)] * 2
    assert math.isfinite(trainer.callback_metrics["val_loss"])
    assert any(not torch.equal(old, new.cpu()) for old, new in zip(before, model.parameters()))
