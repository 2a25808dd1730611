"""Image-to-token stems and fixed position embeddings for the ViT.

Papers: Xiao et al., "Early Convolutions Help Transformers See Better", NeurIPS 2021,
https://arxiv.org/abs/2106.14881 (the convolutional stem); Beyer et al., "Better plain ViT baselines for
ImageNet-1k", https://arxiv.org/abs/2205.01580 (fixed 2-D sin-cos position embeddings).

Both keep the token grid of the patchify stem they replace (``img_size / patch_size`` per side), so every
attention backend sees the same sequence whichever stem is chosen.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from timm.layers import build_sincos2d_pos_embed
from torch import Tensor, nn

from vitzoo.costs import Saved, itemsize
from vitzoo.layers.saved import linear_memory
from vitzoo.registry import ConfigError

Grid = tuple[int, int]


class ConvStem(nn.Module):
    """``log₂ p`` convolutions 3×3, stride 2, each with BatchNorm and ReLU, then a 1×1 convolution to ``C``.

    The widths double towards ``C``: the last 3×3 convolution has ``C`` channels, the one before it ``C/2``, ...
    (Xiao et al. use the same doubling, ending below ``C``; ending at ``C`` gives the small CIFAR models a
    stem of comparable width). ``full_res`` extra 3×3 stride-1 convolutions (BatchNorm, ReLU) at the input
    resolution come first, with half the first stride-2 width (the stride-1 stage of a ResNet or CCT stem).
    Output: tokens ``[B, H/p·W/p, C]`` like timm's ``PatchEmbed``.

    Args:
        img_size: input side in pixels.
        patch_size: total stride ``p``; a power of two, at least 2.
        in_chans: input channels.
        embed_dim: token channels ``C``; divisible by ``2^(log₂ p)`` when ``full_res`` > 0, else by
            ``2^(log₂ p − 1)``.
        full_res: stride-1 convolutions before the stride-2 ones.
    """

    formula = "Σᵢ hᵢwᵢ·cᵢ·(9cᵢ₋₁ + 2) + HW·C²"  # 3×3 convs (BatchNorm folded: 2 per output) + the 1×1 projection

    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int, full_res: int = 0):
        super().__init__()
        stages = int(round(math.log2(patch_size))) if patch_size > 1 else 0
        if patch_size < 2 or 2**stages != patch_size:
            raise ConfigError(f"model.stem=conv needs model.patch_size to be a power of two >= 2 (got {patch_size})")
        halvings = stages - 1 + (full_res > 0)
        if embed_dim % 2**halvings:
            raise ConfigError(
                f"model.stem=conv halves model.embed_dim {halvings} times: it must be divisible by "
                f"{2**halvings} (got {embed_dim})"
            )
        self.full_res = full_res
        self.widths = [in_chans] + [embed_dim // 2**stages] * full_res
        self.widths += [embed_dim // 2 ** (stages - 1 - i) for i in range(stages)]
        self.strides = [1] * full_res + [2] * stages
        layers: list[nn.Module] = []
        for c_in, c_out, stride in zip(self.widths[:-1], self.widths[1:], self.strides):
            layers += [nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(c_out),
                       nn.ReLU(inplace=True)]
        self.convs = nn.Sequential(*layers)
        self.proj = nn.Conv2d(self.widths[-1], embed_dim, 1)
        self.patch_size = (patch_size, patch_size)
        self.grid_size = (img_size // patch_size, img_size // patch_size)

    def forward(self, x: Tensor) -> Tensor:
        x = self.proj(self.convs(x))  # [B, C, H/p, W/p]
        return x.flatten(2).transpose(1, 2)  # [B, H/p·W/p, C]

    def flops(self, grid: Grid) -> int:
        """Multiply-adds for one image whose token grid is ``grid`` (fvcore's conventions: a convolution
        ``out·c_in·k²``, an eval-mode BatchNorm with affine 2 per element, ReLU 0).

        Args:
            grid: the token grid ``(H/p, W/p)``.
        """
        total = 0
        for i, (c_in, c_out) in enumerate(zip(self.widths[:-1], self.widths[1:])):
            scale = 2 ** sum(s == 2 for s in self.strides[i + 1:])  # conv i's map is this many times the grid per side
            hw = grid[0] * scale * grid[1] * scale
            total += hw * c_out * c_in * 9 + 2 * hw * c_out  # 3×3 conv + BatchNorm
        return total + grid[0] * grid[1] * self.proj.out_channels * self.widths[-1]  # 1×1 projection

    def symbols(self, grid: Grid) -> dict[str, int]:
        return {"H": grid[0], "W": grid[1], "C": self.proj.out_channels}

    def memory(self, grid: Grid, batch: int = 1, amp: Optional[torch.dtype] = None) -> list[Saved]:
        """What a training forward keeps for backward (see :mod:`vitzoo.layers.saved`): the image (an autocast
        copy under ``amp``); per 3×3 convolution its weight's autocast copy, BatchNorm's input (the convolution's
        output), batch mean and inverse std, and ReLU's output (in place: the next convolution's input, one
        storage); the 1×1 projection's weight copy.

        Args:
            grid: the token grid ``(H/p, W/p)``; batch: images; amp: autocast dtype or ``None``.
        """
        size, items = itemsize(amp), []
        for i, (c_in, c_out) in enumerate(zip(self.widths[:-1], self.widths[1:])):
            scale = 2 ** sum(s == 2 for s in self.strides[i + 1:])  # conv i's map is this many times the grid per side
            hw = grid[0] * scale * grid[1] * scale
            image = batch * c_in * hw * self.strides[i] ** 2  # [B, c_in, h·s, w·s]: the image for i = 0
            items += linear_memory(f"convs.{3 * i}", image, c_out * c_in * 9, amp, keep_input=i == 0)
            items += [Saved(f"convs.{3 * i + 1} input", batch * c_out * hw, size),  # [B, c_out, h, w]
                      Saved(f"convs.{3 * i + 1} batch mean (fp32)", c_out, 4),
                      Saved(f"convs.{3 * i + 1} batch inverse std (fp32)", c_out, 4),
                      Saved(f"convs.{3 * i + 2} output", batch * c_out * hw, size)]  # [B, c_out, h, w]
        return items + linear_memory("proj", 0, self.proj.out_channels * self.widths[-1], amp, keep_input=False)


def sincos_pos_embed(grid: Grid, dim: int, num_prefix: int) -> Tensor:
    """Fixed 2-D sin-cos position embeddings ``[1, P + H·W, C]`` (zeros for the ``P`` prefix tokens).

    Args:
        grid: token grid ``(H, W)``.
        dim: channels ``C``; divisible by 4 (sin and cos of both axes).
        num_prefix: prefix tokens in front of the grid (the class token).
    """
    if dim % 4:
        raise ConfigError(f"model.pos_embed=sincos needs model.embed_dim divisible by 4 (got {dim})")
    pos = build_sincos2d_pos_embed(list(grid), dim)  # [H·W, C]
    return torch.cat([pos.new_zeros(num_prefix, dim), pos]).unsqueeze(0)  # [1, P + H·W, C]
