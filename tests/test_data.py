"""DataModules: digits (offline default), CIFAR error paths, image folders (synthetic and the shared CIFAR-10 JPEGs)."""
from __future__ import annotations

import urllib.error

import pytest
import torch
from PIL import Image

from conftest import CIFAR_ROOT
from vitzoo.registry import ConfigError
from vitzoo.training.data import (CIFARDataModule, DigitsDataModule, ImageFolderDataModule, build_transform,
                                  stratified_split)


def digits(**kw):
    dm = DigitsDataModule(name="digits", img_size=32, batch_size=16, num_classes=10, flip=False, **kw)
    dm.setup("fit")
    return dm


def test_digits_split_is_fixed_balanced_and_shaped():
    dm = digits()
    assert dm.num_classes == 10 and (len(dm.train_set), len(dm.val_set)) == (1617, 180)
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert -1.01 <= x.min() and x.max() <= 1.01  # [0, 1] normalised by mean=std=0.5
    val_labels = [dm.val_set[i][1] for i in range(len(dm.val_set))]
    assert set(val_labels) == set(range(10))  # stratified: every class in validation
    again = digits()
    assert torch.equal(dm.val_set[0][0], again.val_set[0][0])  # same seed, same split, no val augmentation
    other = digits(seed=1)
    assert dm.val_set.base.indices != other.val_set.base.indices


def test_digits_train_augmentation_crops():
    dm = digits()
    torch.manual_seed(0)
    views = torch.stack([dm.train_set[0][0] for _ in range(8)])
    assert views.std(0).max() > 0  # random crops differ


def test_stratified_split_rejects_bad_fraction():
    with pytest.raises(ConfigError, match="data.val_fraction"):
        stratified_split([0, 1] * 10, 1.5, 0)


def test_large_images_use_timm_transform():
    img = Image.new("RGB", (32, 32), (120, 30, 200))
    for train in (True, False):
        t = build_transform(224, (0.5,) * 3, (0.5,) * 3, train=train)
        assert t(img).shape == (3, 224, 224)


def test_cifar_missing_without_download(tmp_path):
    dm = CIFARDataModule(name="cifar10", root=str(tmp_path), download=False)
    with pytest.raises(ConfigError, match=r"data.root=.*data.download=true"):
        dm.prepare_data()


def test_cifar_offline_download_is_one_line(tmp_path, monkeypatch):
    from torchvision.datasets import CIFAR10

    def offline(self):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(CIFAR10, "download", offline)
    dm = CIFARDataModule(name="cifar10", root=str(tmp_path), download=True)
    with pytest.raises(ConfigError) as err:
        dm.prepare_data()
    msg = str(err.value)
    assert "\n" not in msg and "could not download cifar10" in msg and str(tmp_path) in msg and "data=imagefolder" in msg


def make_folder(root, split, classes=("cat", "dog"), per_class=5, size=12):
    for c, name in enumerate(classes):
        d = root / split / name
        d.mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (size, size), (40 * c, 10 * i, 100)).save(d / f"{i}.png")


@pytest.mark.parametrize("with_val", [False, True])
def test_imagefolder_layouts(tmp_path, with_val):
    make_folder(tmp_path, "train", per_class=10)
    if with_val:
        make_folder(tmp_path, "val", per_class=3)
    dm = ImageFolderDataModule(name="imagefolder", root=str(tmp_path), img_size=16, batch_size=4, val_fraction=0.2)
    dm.setup("fit")
    assert dm.classes == ["cat", "dog"] and dm.num_classes == 2
    assert (len(dm.train_set), len(dm.val_set)) == ((20, 6) if with_val else (16, 4))
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 16, 16)


def test_imagefolder_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"data.root=.*does not exist"):
        ImageFolderDataModule(name="imagefolder", root=str(tmp_path / "nowhere")).setup()
    make_folder(tmp_path, "train")
    with pytest.raises(ConfigError, match="data.num_classes=5 but imagefolder has 2 classes"):
        ImageFolderDataModule(name="imagefolder", root=str(tmp_path), num_classes=5, val_fraction=0.2).setup()


@pytest.mark.skipif(not (CIFAR_ROOT / "train").is_dir(), reason=f"CIFAR-10 JPEGs not found at {CIFAR_ROOT} (env VITZOO_CIFAR10)")
def test_imagefolder_reads_shared_cifar10():
    dm = ImageFolderDataModule(name="imagefolder", root=str(CIFAR_ROOT), img_size=32, batch_size=8, num_classes=10)
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set)) == (45000, 5000)
    assert dm.classes[:3] == ["airplane", "automobile", "bird"]
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (8, 3, 32, 32) and y.max() < 10
