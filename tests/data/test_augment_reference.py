"""The batched augmentation against plain references on asymmetric images: the flip is a horizontal mirror,
each crop is a slice of the zero-padded image, and the policies are torchvision's on the same random draws."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from torchvision.transforms import v2

from vitzoo.data.augment import POLICY_GROUP, BatchAugment, random_crop, random_flip


def asymmetric_images(b: int = 16, s: int = 16) -> torch.Tensor:
    """uint8 ``[b, 3, s, s]`` with no mirror or rotation symmetry: every pixel value differs."""
    g = torch.Generator().manual_seed(1)
    base = torch.arange(3 * s * s).view(3, s, s) % 251
    return torch.stack([(base + torch.randint(0, 5, (1,), generator=g)) % 256 for _ in range(b)]).to(torch.uint8)


def mirror(img: torch.Tensor) -> torch.Tensor:
    """Left-right mirror of ``[C, H, W]`` through numpy (columns reversed), independent of torch's flip."""
    return torch.from_numpy(img.numpy()[:, :, ::-1].copy())


def test_flip_is_a_horizontal_mirror_of_the_drawn_images():
    x = asymmetric_images()
    torch.manual_seed(3)
    out = random_flip(x)
    torch.manual_seed(3)
    drawn = torch.rand(x.shape[0]) < 0.5  # the draw random_flip makes: one uniform per image
    assert 0 < int(drawn.sum()) < x.shape[0]
    for i in range(x.shape[0]):
        expected = mirror(x[i]) if drawn[i] else x[i]
        assert torch.equal(out[i], expected), f"image {i}: flipped={bool(drawn[i])}"
    assert not torch.equal(x[0].flip(-2), x[0].flip(-1))  # a vertical flip would be caught


@pytest.mark.parametrize("padding", [1, 2, 4])
def test_each_crop_is_a_slice_of_the_padded_image(padding):
    x = asymmetric_images()
    s = x.shape[-1]
    torch.manual_seed(5)
    out = random_crop(x, padding)
    torch.manual_seed(5)
    offsets = torch.randint(0, 2 * padding + 1, (x.shape[0], 2))  # the draw random_crop makes: (row, col) each
    padded = torch.zeros(x.shape[0], 3, s + 2 * padding, s + 2 * padding, dtype=x.dtype)
    padded[:, :, padding:padding + s, padding:padding + s] = x
    for i, (r, c) in enumerate(offsets.tolist()):
        assert torch.equal(out[i], padded[i, :, r:r + s, c:c + s]), f"image {i}: offset ({r}, {c})"
    assert len({tuple(o) for o in offsets.tolist()}) > 1


@pytest.mark.parametrize("policy,cls", [("trivial", v2.TrivialAugmentWide), ("rand", v2.RandAugment)])
def test_policy_is_torchvisions_on_the_same_draws(policy, cls):
    x = asymmetric_images(b=2 * POLICY_GROUP, s=32)
    aug = BatchAugment(mean=[0.0] * 3, std=[1.0] * 3, policy=policy, flip=True).train()
    torch.manual_seed(11)
    out = aug(x)
    torch.manual_seed(11)
    ref_policy = cls()
    y = torch.cat([ref_policy(g) for g in x.split(POLICY_GROUP)])  # one draw per group of POLICY_GROUP images
    p = y.shape[-1] // 8
    offsets = torch.randint(0, 2 * p + 1, (y.shape[0], 2))
    flips = torch.rand(y.shape[0]) < 0.5
    padded = F.pad(y, (p, p, p, p))
    for i, (r, c) in enumerate(offsets.tolist()):
        img = padded[i, :, r:r + 32, c:c + 32]
        img = mirror(img) if flips[i] else img
        assert torch.allclose(out[i], img.float() / 255.0), f"image {i}"


def test_eval_mode_only_normalises():
    x = asymmetric_images()
    aug = BatchAugment(mean=[0.5, 0.4, 0.3], std=[0.2, 0.25, 0.3], policy="trivial").eval()
    mean, std = torch.tensor([0.5, 0.4, 0.3]).view(1, 3, 1, 1), torch.tensor([0.2, 0.25, 0.3]).view(1, 3, 1, 1)
    expected = (x.float() / 255 - mean) / std
    assert torch.allclose(aug(x), expected)


@pytest.mark.parametrize("crop_pad", [0, 2])
def test_crop_pad_sets_the_largest_shift_on_both_paths(crop_pad):
    """data.crop_pad: the batched crop and the per-image transform shift by at most crop_pad pixels (0: none)."""
    from vitzoo.data.transforms import build_transform

    x = asymmetric_images(b=64)
    s = x.shape[-1]
    aug = BatchAugment(mean=[0.0] * 3, std=[1.0] * 3, flip=False, crop_pad=crop_pad).train()
    per_image = build_transform(s, [0.0] * 3, [1.0] * 3, train=True, flip=False, crop_pad=crop_pad, use_timm=False)
    torch.manual_seed(0)
    for out in (aug(x), torch.stack([per_image(img.float() / 255.0) for img in x])):
        shifts = set()
        for i in range(x.shape[0]):
            padded = F.pad(x[i].float() / 255.0, (crop_pad,) * 4)
            found = [(r, c) for r in range(2 * crop_pad + 1) for c in range(2 * crop_pad + 1)
                     if torch.allclose(out[i], padded[:, r:r + s, c:c + s])]
            assert found, f"image {i} is no crop of the image padded by {crop_pad}"
            shifts.add(found[0])
        assert shifts == {(0, 0)} if crop_pad == 0 else len(shifts) > 1  # no shift at 0; several draws otherwise


def test_a_bad_crop_pad_names_the_option():
    from vitzoo.data.datamodules import DigitsDataModule
    from vitzoo.registry import ConfigError

    for bad in (-1, 2.5, True, 33):
        with pytest.raises(ConfigError, match=r"data\.crop_pad"):
            DigitsDataModule(name="digits", img_size=32, crop_pad=bad)
