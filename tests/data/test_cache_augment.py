"""Decode once (uint8 cache keyed by the folder's contents) and batched device augmentation."""
from __future__ import annotations

import os

import pytest
import torch
from helpers import image_folder
from PIL import Image

from vitzoo.data.augment import BatchAugment, random_crop
from vitzoo.data.datamodules import ImageFolderDataModule
from vitzoo.registry import ConfigError

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
# two classes of six solid-colour 20×20 images under <root>/train, image i of class c coloured (40·c, 10·i, 100)
FOLDER = dict(classes=("cat", "dog"), per_class=6, size=20, split="train", colour_steps=(40, 10))


def cached_dm(root, cache_dir, **kw):
    dm = ImageFolderDataModule(name="imagefolder", root=str(root), img_size=16, batch_size=4, val_fraction=0.25,
                               mean=MEAN, std=STD, cache=True, cache_dir=str(cache_dir), **kw)
    dm.setup("fit")
    return dm


def test_cache_is_built_once_and_rebuilt_when_a_file_changes(tmp_path):
    image_folder(tmp_path / "data", **FOLDER)
    cache = tmp_path / "cache"
    dm = cached_dm(tmp_path / "data", cache)
    files = sorted(cache.glob("*.pt"))
    assert len(files) == 1 and not list(cache.glob("*.tmp"))
    images = dm.train_set.base.dataset.images
    assert images.dtype == torch.uint8 and images.shape == (12, 3, 16, 16)
    assert tuple(images[0, :, 0, 0].tolist()) == (0, 0, 100)  # cat/0.png: colour (0, 0, 100)
    stamp = files[0].stat().st_mtime_ns
    cached_dm(tmp_path / "data", cache)  # unchanged folder: the same file, not rewritten
    assert sorted(cache.glob("*.pt")) == files and files[0].stat().st_mtime_ns == stamp

    changed = tmp_path / "data" / "train" / "cat" / "0.png"
    Image.new("RGB", (20, 20), (255, 255, 255)).save(changed)
    os.utime(changed, ns=(stamp + 10**9, stamp + 10**9))  # a new mtime even on coarse file systems
    again = cached_dm(tmp_path / "data", cache)
    assert len(list(cache.glob("*.pt"))) == 2  # new key -> rebuilt
    assert tuple(again.train_set.base.dataset.images[0, :, 0, 0].tolist()) == (255, 255, 255)


def test_device_augment_loader_yields_uint8_batches_normalised_after_transfer(tmp_path):
    image_folder(tmp_path / "data", **FOLDER)
    dm = cached_dm(tmp_path / "data", tmp_path / "cache", device_augment=True, policy="trivial")
    idx, y, data = next(iter(dm.val_dataloader()))  # indices: the images stay where they are
    x = data.images[idx]
    assert x.dtype == torch.uint8 and x.shape == (3, 3, 16, 16) and y.dtype == torch.int64
    out, labels = dm.on_after_batch_transfer((idx, y, data), 0)  # no trainer: eval mode, normalise only
    assert data.on_device(idx.device) is data.on_device(idx.device)  # copied to the device once
    expected = (x.float() / 255 - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    torch.testing.assert_close(out, expected)
    assert torch.equal(labels, y)


def test_device_augment_needs_the_cache(tmp_path):
    with pytest.raises(ConfigError, match="data.device_augment=true needs data.cache=true"):
        ImageFolderDataModule(name="imagefolder", root=str(tmp_path), device_augment=True)


@pytest.mark.parametrize("policy", [None, "trivial", "rand"])
def test_batch_augment_shapes_and_value_ranges(policy):
    torch.manual_seed(0)
    x = torch.randint(0, 256, (32, 3, 32, 32), dtype=torch.uint8)
    aug = BatchAugment(MEAN, STD, policy=policy).train()
    out = aug(x)
    assert out.shape == x.shape and out.dtype == torch.float32 and torch.isfinite(out).all()
    low = (0 - torch.tensor(MEAN)) / torch.tensor(STD)
    high = (1 - torch.tensor(MEAN)) / torch.tensor(STD)
    assert (out >= low.view(1, 3, 1, 1) - 1e-5).all() and (out <= high.view(1, 3, 1, 1) + 1e-5).all()
    assert not torch.allclose(out, aug.eval()(x))  # training mode changes the images


def test_random_crop_draws_per_image_offsets():
    torch.manual_seed(0)
    x = torch.arange(16.0).view(1, 1, 4, 4).expand(64, 1, 4, 4)
    out = random_crop(x, padding=1)
    assert out.shape == x.shape
    assert len({tuple(o.flatten().tolist()) for o in out}) > 3  # images of one batch are cropped differently
    for o in out:  # every crop is a shifted window of the zero-padded image
        nz = o[o != 0]
        assert set(nz.tolist()) <= set(range(16))


def test_unknown_policy_is_one_line():
    with pytest.raises(ConfigError, match="data.policy='auto' is not a policy"):
        BatchAugment(MEAN, STD, policy="auto")
