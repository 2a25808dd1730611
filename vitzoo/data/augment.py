"""Batched small-image augmentation on the training device: uint8 ``[B, 3, S, S]`` in, normalised float out.

Each image draws its own pad-crop offset and flip (vectorised: one gather for the whole batch); the
policy (torchvision's ``TrivialAugmentWide`` or ``RandAugment``) draws one operation per group of
:data:`POLICY_GROUP` images, since torchvision's v2 transforms draw one set of parameters per call.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torchvision.transforms import v2

from vitzoo.registry import ConfigError

POLICY_GROUP = 8  # images sharing one policy draw (a batch of 128: 16 draws per step)
POLICIES = {"trivial": v2.TrivialAugmentWide, "rand": v2.RandAugment}  # data.policy choices


def random_crop(x: Tensor, padding: int) -> Tensor:
    """Per-image random crop of ``x`` ``[B, C, S, S]`` zero-padded by ``padding`` (back to ``S x S``)."""
    if padding <= 0:
        return x
    b, _, s, _ = x.shape
    padded = F.pad(x, (padding,) * 4)
    offsets = torch.randint(0, 2 * padding + 1, (b, 2), device=x.device)
    rows = (offsets[:, 0, None] + torch.arange(s, device=x.device)).view(b, 1, s, 1)  # [B, 1, S, 1]
    cols = (offsets[:, 1, None] + torch.arange(s, device=x.device)).view(b, 1, 1, s)  # [B, 1, 1, S]
    batch = torch.arange(b, device=x.device).view(b, 1, 1, 1)
    channels = torch.arange(x.shape[1], device=x.device).view(1, -1, 1, 1)
    return padded[batch, channels, rows, cols]


def random_flip(x: Tensor) -> Tensor:
    """Flip each image of ``x`` ``[B, C, H, W]`` horizontally with probability 1/2."""
    flip = torch.rand(x.shape[0], device=x.device) < 0.5
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)


class BatchAugment(nn.Module):
    """uint8 images ``[B, 3, S, S]`` -> float ``[B, 3, S, S]`` normalised; augmented in training mode.

    Args:
        mean, std: per-channel normalisation (of images scaled to [0, 1]).
        augment: pad-crop in training mode.
        flip: random horizontal flip in training mode.
        policy: ``trivial`` (TrivialAugmentWide), ``rand`` (RandAugment) or None (off).
        crop_pad: zero padding of the random crop in pixels (None: ``S // 8``; 0: no crop).
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], augment: bool = True, flip: bool = True,
                 policy: Optional[str] = None, crop_pad: Optional[int] = None):
        super().__init__()
        if policy is not None and policy not in POLICIES:
            raise ConfigError(f"data.policy={policy!r} is not a policy; choose one of: {', '.join(POLICIES)} or null")
        self.augment, self.flip, self.crop_pad = augment, flip, crop_pad
        self.policy = POLICIES[policy]() if policy is not None else None
        self.register_buffer("mean", torch.tensor(list(mean), dtype=torch.float32).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(list(std), dtype=torch.float32).view(1, 3, 1, 1), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype != torch.uint8:
            raise ConfigError(
                f"device augmentation expects uint8 images (got {x.dtype}); set data.device_augment=false"
            )
        if self.training and self.augment:
            if self.policy is not None:
                x = torch.cat([self.policy(group) for group in x.split(POLICY_GROUP)])
            x = random_crop(x, x.shape[-1] // 8 if self.crop_pad is None else self.crop_pad)
            if self.flip:
                x = random_flip(x)
        mean, std = self.mean.to(x.device), self.std.to(x.device)
        return (x.float() / 255.0 - mean) / std
