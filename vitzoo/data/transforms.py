"""Image transforms: training augmentation and evaluation resizing, shared by the data modules and by
exported models (:func:`vitzoo.export.preprocess`, so inference needs no Lightning).

At small sizes (``img_size <= 64``) random crop with padding ``img_size // 8`` (4 px at 32 px) and
horizontal flip; at larger sizes timm's ``create_transform`` (random resized crop, flip, optional
RandAugment). Evaluation images are only resized and normalised.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
from torchvision.transforms import v2

SMALL_IMAGE = 64  # at or below this side, crop+flip augmentation; above it, timm's create_transform


def build_transform(img_size: int, mean: Sequence[float], std: Sequence[float], train: bool, flip: bool = True,
                    crop_pad: Optional[int] = None, auto_augment: Optional[str] = None,
                    crop_pct: Optional[float] = None, use_timm: Optional[bool] = None) -> Callable:
    """Image (PIL or ``[3, H, W]`` tensor in [0, 1]) -> normalised ``[3, img_size, img_size]`` float tensor.

    Args:
        img_size: output side in pixels.
        mean, std: per-channel normalisation.
        train: training augmentation (crop/flip, or timm's random resized crop) instead of eval resizing.
        flip: random horizontal flip while training (off for digits).
        crop_pad: zero padding of the small-image random crop (None: ``img_size // 8``; 0: no crop).
        auto_augment: timm policy string (e.g. ``rand-m9-mstd0.5-inc1``), used above :data:`SMALL_IMAGE` px.
        crop_pct: eval centre-crop fraction for the timm path (None: timm's default 0.875).
        use_timm: timm's transform (PIL input) or the small-image path (PIL or tensor); None: by ``img_size``.
    """
    if use_timm if use_timm is not None else img_size > SMALL_IMAGE:
        from timm.data import create_transform

        return create_transform(
            img_size,
            is_training=train,
            mean=tuple(mean),
            std=tuple(std),
            hflip=0.5 if flip else 0.0,
            auto_augment=auto_augment,
            crop_pct=crop_pct,
            interpolation="bicubic",
        )
    steps: list[Any] = [v2.ToImage(), v2.Resize((img_size, img_size), antialias=True)]
    if train:
        pad = img_size // 8 if crop_pad is None else crop_pad
        if pad > 0:
            steps.append(v2.RandomCrop(img_size, padding=pad))
        if flip:
            steps.append(v2.RandomHorizontalFlip())
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]
    return v2.Compose(steps)
