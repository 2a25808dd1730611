"""DataModules: digits (offline default), CIFAR error paths, image folders (synthetic and the shared CIFAR-10 JPEGs)."""
from __future__ import annotations

import urllib.error

import pytest
import torch
from conftest import CIFAR_ROOT
from helpers import bomb_png, image_folder
from PIL import Image

from vitzoo.data.datamodules import CIFARDataModule, DigitsDataModule, ImageFolderDataModule
from vitzoo.data.datasets import stratified_split
from vitzoo.data.transforms import build_transform
from vitzoo.registry import ConfigError


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
    assert (
        "\n" not in msg and "could not download cifar10" in msg and str(tmp_path) in msg and "data=imagefolder" in msg
    )


# cat/dog folders of solid-colour 12×12 images, image i of class c coloured (40·c, 10·i, 100)
COLOURED = dict(classes=("cat", "dog"), size=12, colour_steps=(40, 10))


@pytest.mark.parametrize("with_val", [False, True])
def test_imagefolder_layouts(tmp_path, with_val):
    image_folder(tmp_path, per_class=10, split="train", **COLOURED)
    if with_val:
        image_folder(tmp_path, per_class=3, split="val", **COLOURED)
    dm = ImageFolderDataModule(name="imagefolder", root=str(tmp_path), img_size=16, batch_size=4, val_fraction=0.2)
    dm.setup("fit")
    assert dm.classes == ["cat", "dog"] and dm.num_classes == 2
    assert (len(dm.train_set), len(dm.val_set)) == ((20, 6) if with_val else (16, 4))
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 16, 16)


def test_imagefolder_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"data.root=.*does not exist"):
        ImageFolderDataModule(name="imagefolder", root=str(tmp_path / "nowhere")).setup()
    image_folder(tmp_path, per_class=5, split="train", **COLOURED)
    with pytest.raises(ConfigError, match="data.num_classes=5 but imagefolder has 2 classes"):
        ImageFolderDataModule(name="imagefolder", root=str(tmp_path), num_classes=5, val_fraction=0.2).setup()


@pytest.mark.skipif(
    not (CIFAR_ROOT / "train").is_dir(), reason=f"CIFAR-10 JPEGs not found at {CIFAR_ROOT} (env VITZOO_CIFAR10)"
)
def test_imagefolder_reads_shared_cifar10():
    dm = ImageFolderDataModule(name="imagefolder", root=str(CIFAR_ROOT), img_size=32, batch_size=8, num_classes=10)
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set)) == (45000, 5000)
    assert dm.classes[:3] == ["airplane", "automobile", "bird"]
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (8, 3, 32, 32) and y.max() < 10


# ------------------------------------------------------------------------------------------- normalisation
# Every path must hand the model (image - mean) / std per channel, with the mean/std of its data config.


def data_module(overrides):
    """The DataModule that ``configs/train.yaml`` with ``overrides`` instantiates (as training does)."""
    from conftest import CONFIGS
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides))
    return instantiate(cfg.data), cfg.data


def per_channel(x):
    """``x[B, 3, H, W]`` -> per-channel mean and std over everything else."""
    x = x.transpose(0, 1).reshape(3, -1).double()
    return x.mean(1), x.std(1)


def test_digits_come_out_normalised_with_the_configured_mean_and_std():
    """At img_size=8 the images are sklearn's own pixels (/16): each validation image must equal
    (pixel - mean) / std per channel, and the set's per-channel statistics must follow from sklearn's."""
    from sklearn.datasets import load_digits

    mean, std = (0.3, 0.2, 0.1), (0.25, 0.5, 0.125)  # distinct per channel: a channel mix-up shows
    dm, cfg = data_module(
        [
            "data=digits",
            "data.img_size=8",
            f"data.mean=[{','.join(map(str, mean))}]",
            f"data.std=[{','.join(map(str, std))}]",
        ]
    )
    dm.setup("fit")
    raw = torch.tensor(load_digits().images, dtype=torch.float64) / 16.0  # [N, 8, 8] in [0, 1]
    m, s = torch.tensor(mean, dtype=torch.float64), torch.tensor(std, dtype=torch.float64)
    idx = dm.val_set.base.indices
    got = torch.stack([dm.val_set[i][0] for i in range(len(dm.val_set))]).double()  # [180, 3, 8, 8]
    expected = (raw[idx][:, None] - m[:, None, None]) / s[:, None, None]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    mu, sd = per_channel(got)
    torch.testing.assert_close(mu, (raw[idx].mean() - m) / s, rtol=0, atol=1e-5)
    torch.testing.assert_close(sd, raw[idx].std() / s, rtol=1e-4, atol=0)

    # the shipped config: mean = std = 0.5 maps [0, 1] onto [-1, 1] (blank pixels to exactly -1)
    dm, cfg = data_module(["data=digits"])
    dm.setup("fit")
    assert (tuple(cfg.mean), tuple(cfg.std)) == ((0.5,) * 3, (0.5,) * 3)
    x, _ = next(iter(dm.val_dataloader()))
    assert x.min() == -1.0 and 0.9 < x.max() <= 1.0


@pytest.mark.parametrize("img_size,use_timm", [(32, False), (224, True)])
def test_build_transform_maps_the_mean_colour_to_zero(img_size, use_timm):
    """A constant image whose colour is the mean maps to 0, one at mean + std to 1 (both transform paths)."""
    mean, std = (100 / 255, 150 / 255, 200 / 255), (0.2, 0.3, 0.1)
    t = build_transform(img_size, mean, std, train=False, use_timm=use_timm)
    zero = t(Image.new("RGB", (40, 40), (100, 150, 200)))
    assert zero.shape == (3, img_size, img_size)
    torch.testing.assert_close(zero, torch.zeros_like(zero), rtol=0, atol=1e-5)
    one = t(Image.new("RGB", (40, 40), tuple(round(255 * (m + s)) for m, s in zip(mean, std))))
    expected = torch.tensor([(round(255 * (m + s)) / 255 - m) / s for m, s in zip(mean, std)])
    torch.testing.assert_close(one, expected[:, None, None].expand_as(one), rtol=0, atol=1e-5)


def write_fake_cifar10(root, colours_train, colours_test):
    """A ``cifar-10-batches-py`` folder in torchvision's pickle format with constant-colour images."""
    import pickle

    import numpy as np

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)

    def batch(colours):
        data = np.stack([np.repeat(np.array(c, dtype=np.uint8), 32 * 32) for c in colours])  # [n, 3072] CHW
        return {"data": data, "labels": [i % 10 for i in range(len(colours))]}

    for i in range(1, 6):
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(batch(colours_train)))
    (folder / "test_batch").write_bytes(pickle.dumps(batch(colours_test)))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))


def test_cifar_path_normalises_with_the_configured_mean_and_std(tmp_path, monkeypatch):
    """configs/data/cifar10.yaml on a tiny fake CIFAR-10: every validation image equals (colour/255 - mean) / std."""
    import torchvision.datasets.cifar as tv_cifar

    monkeypatch.setattr(tv_cifar, "check_integrity", lambda *a, **k: True)  # fake files have no official md5
    colours = [(10 * i, 255 - 20 * i, 125) for i in range(10)]
    write_fake_cifar10(tmp_path, colours, colours)
    dm, cfg = data_module(["data=cifar10", f"data.root={tmp_path}", "data.download=false", "data.num_workers=0"])
    dm.prepare_data()
    dm.setup("fit")
    assert tuple(cfg.mean) == (0.4914, 0.4822, 0.4465) and tuple(cfg.std) == (0.2470, 0.2435, 0.2616)
    m, s = torch.tensor(cfg.mean), torch.tensor(cfg.std)
    for i, colour in enumerate(colours):
        x, y = dm.val_set[i]
        expected = (torch.tensor(colour) / 255 - m) / s
        torch.testing.assert_close(x, expected[:, None, None].expand(3, 32, 32), rtol=0, atol=1e-5)


@pytest.mark.parametrize("img_size", [16, 96])  # small-image path and timm's transform
def test_imagefolder_path_normalises_with_the_configured_mean_and_std(tmp_path, img_size):
    image_folder(tmp_path, per_class=4, split="train", **COLOURED)
    image_folder(tmp_path, per_class=2, split="val", **COLOURED)  # colours (40·c, 10·i, 100)
    dm, cfg = data_module(
        ["data=imagefolder", f"data.root={tmp_path}", f"model.img_size={img_size}", "data.num_workers=0"]
    )
    dm.setup("fit")
    assert tuple(cfg.mean) == (0.485, 0.456, 0.406) and tuple(cfg.std) == (0.229, 0.224, 0.225)
    m, s = torch.tensor(cfg.mean), torch.tensor(cfg.std)
    for k in range(len(dm.val_set)):
        x, label = dm.val_set[k]
        i = k % 2  # ImageFolder lists files sorted: 0.png, 1.png per class
        expected = (torch.tensor([40 * label, 10 * i, 100]) / 255 - m) / s
        assert x.shape == (3, img_size, img_size)
        torch.testing.assert_close(x, expected[:, None, None].expand_as(x), rtol=0, atol=1e-5)


def test_cifar_device_augment_path_normalises_on_the_device_side(tmp_path, monkeypatch):
    """data.cache + data.device_augment on a fake CIFAR-10: uint8 batches in, (colour/255 - mean) / std out."""
    import torchvision.datasets.cifar as tv_cifar

    monkeypatch.setattr(tv_cifar, "check_integrity", lambda *a, **k: True)  # fake files have no official md5
    colours = [(10 * i, 255 - 20 * i, 125) for i in range(10)]
    write_fake_cifar10(tmp_path, colours, colours)
    dm, cfg = data_module(
        [
            "data=cifar10",
            f"data.root={tmp_path}",
            "data.download=false",
            "data.cache=true",
            "data.device_augment=true",
            "data.batch_size=10",
        ]
    )
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.val_dataloader()))
    assert batch[2].images.dtype == torch.uint8 and batch[2].images[batch[0]].shape == (10, 3, 32, 32)
    out, _ = dm.device_batch(batch, train=False)
    m, s = torch.tensor(cfg.mean), torch.tensor(cfg.std)
    for i, colour in enumerate(colours):
        expected = (torch.tensor(colour) / 255 - m) / s
        torch.testing.assert_close(out[i], expected[:, None, None].expand(3, 32, 32), rtol=0, atol=1e-5)
    train_x, _ = dm.device_batch(next(iter(dm.train_dataloader())), train=True)
    assert train_x.shape == (10, 3, 32, 32) and train_x.dtype == torch.float32


def test_a_decompression_bomb_in_training_data_names_the_file_and_data_root(tmp_path):
    """A 20000×20000 1-bit PNG (a few kB) among the training images is one line naming it and data.root; it is
    refused from its header, before anything is decoded, and the other images still read."""
    from vitzoo.data.datasets import image_folder as read_folder

    image_folder(tmp_path, per_class=2, split="train", **COLOURED)
    bomb = bomb_png(tmp_path / "train" / "cat" / "zz_bomb.png")
    found = read_folder(tmp_path / "train")
    index = [p for p, _ in found.samples].index(str(bomb))
    with pytest.raises(ConfigError, match=r"^cannot read image .*zz_bomb.png \(400000000 pixels, over the limit of "
                                          r"67108864\); remove or replace it under data.root") as err:
        found[index]
    assert "\n" not in str(err.value)
    assert found[0][0].size == (12, 12)


def test_a_12000_square_png_is_refused_by_the_pixel_limit_before_it_is_decoded(tmp_path, monkeypatch):
    """144 MP lies under PIL's own bomb error (about 179 MP) and decodes to 2.3 GB: the reader's pixel limit, an
    option of predict (``--max-pixels``), refuses it from its header; nothing of it is decoded."""
    from vitzoo.data.datasets import MAX_PIXELS, read_rgb
    from vitzoo.export.predict import Predictor, predict_files

    big = bomb_png(tmp_path / "big.png", side=12000)
    assert big.stat().st_size < 100_000
    decoded = []
    monkeypatch.setattr(Image.Image, "load", lambda self: decoded.append(self) or None)
    with pytest.raises(ConfigError, match=rf"^cannot read image .*big.png \(12000×12000 = 144000000 pixels, over the "
                                          rf"limit of {MAX_PIXELS}\); remove or replace it$"):
        read_rgb(big)
    data = {"img_size": 8, "mean": [0.5] * 3, "std": [0.5] * 3, "classes": ["a", "b"]}
    out = dict(predict_files(Predictor(lambda x: torch.zeros(x.shape[0], 2), data), [big], max_pixels=MAX_PIXELS,
                             option="--max-pixels"))
    assert isinstance(out[big], ConfigError) and "144000000 pixels" in str(out[big]) and "--max-pixels" in str(out[big])
    assert decoded == []
