"""Window partitioning for windowed attention (Swin W-MSA / SW-MSA, ViTDet windows).

The host block (ViT or Swin) owns all geometry: padding the grid to a multiple of the window,
the cyclic shift, partitioning into windows and the additive mask; the attention module only
sees window tokens ``[B·nW, P + M², C]``.

* Padding: a grid the window does not divide is padded at the bottom/right with zero tokens;
  padded tokens are masked out as keys (unlike the original Swin code, which lets real tokens
  attend to them) and cropped from the output.
* Shift: SW-MSA rolls the padded grid by ``-s`` and masks pairs of tokens that come from
  different regions of the un-rolled image, exactly as Swin does.
* Prefix tokens (ViT's class token): they join every window as extra tokens (queries and keys);
  their outputs are averaged over the windows. Patch tokens thus see the class token, and the
  class token sees every patch through the windows.
"""
from __future__ import annotations

import functools
import math

import torch
from torch import Tensor
import torch.nn.functional as F

Grid = tuple[int, int]


def padded_grid(grid: Grid, window: int) -> Grid:
    """Smallest grid >= ``grid`` whose sides are multiples of ``window``."""
    return tuple(math.ceil(s / window) * window for s in grid)


def num_windows(grid: Grid, window: int) -> int:
    hp, wp = padded_grid(grid, window)
    return (hp // window) * (wp // window)


def window_partition(x: Tensor, window: int) -> Tensor:
    """``x[B, H, W, C] -> [B·nW, M·M, C]`` (H, W multiples of M)."""
    B, H, W, C = x.shape
    x = x.view(B, H // window, window, W // window, window, C)  # [B, H/M, M, W/M, M, C]
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window * window, C)


def window_reverse(windows: Tensor, window: int, H: int, W: int) -> Tensor:
    """``windows[B·nW, M·M, C] -> [B, H, W, C]``: inverse of :func:`window_partition`."""
    C = windows.shape[-1]
    x = windows.view(-1, H // window, W // window, window, window, C)  # [B, H/M, W/M, M, M, C]
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, H, W, C)


@functools.lru_cache(maxsize=64)
def window_mask(grid: Grid, window: int, shift: int, num_prefix: int) -> Tensor | None:
    """Additive mask ``[nW, P + M², P + M²]`` (0 allowed, -inf masked), or None when nothing is masked.

    Masks keys that are padding and, with a shift, pairs of tokens from different image regions.
    """
    H, W = grid
    hp, wp = padded_grid(grid, window)
    if shift == 0 and (hp, wp) == (H, W):
        return None
    region = torch.zeros(1, hp, wp, 1)
    if shift:  # Swin's 3x3 regions of the rolled image
        cuts = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
        for i, (hs, ws) in enumerate((a, b) for a in cuts for b in cuts):
            region[:, hs, ws, :] = i
    pad = torch.zeros(1, hp, wp, 1, dtype=torch.bool)
    pad[:, H:, :, :] = True
    pad[:, :, W:, :] = True
    if shift:
        pad = torch.roll(pad, (-shift, -shift), dims=(1, 2))
    region = window_partition(region, window).squeeze(-1)  # [nW, M²]
    pad = window_partition(pad, window).squeeze(-1)  # [nW, M²]
    other_region = region[:, :, None] != region[:, None, :]  # [nW, M², M²]
    other_region = F.pad(other_region, (num_prefix, 0, num_prefix, 0), value=False)  # prefix: any region
    pad = F.pad(pad, (num_prefix, 0), value=False)  # [nW, P + M²]
    blocked = other_region | pad[:, None, :]  # [nW, T, T] with T = P + M²
    blocked &= ~torch.eye(blocked.shape[-1], dtype=torch.bool)  # a padded query keeps itself: no empty row
    return torch.zeros(blocked.shape).masked_fill(blocked, float("-inf"))


def windowed_call(attn, x: Tensor, grid: Grid, shift: int) -> Tensor:
    """Run a windowed mixer over ``x[B, P + H·W, C]``: pad, roll, partition, attend, reverse.

    Args:
        attn: a mixer with ``windowed = True``, ``window_size`` and ``num_prefix`` attributes.
        x: prefix tokens followed by grid tokens in row-major order.
        grid: (H, W).
        shift: cyclic shift s (0 for W-MSA, typically M//2 for SW-MSA).
    """
    M, P = attn.window_size, attn.num_prefix
    B, _, C = x.shape
    H, W = grid
    hp, wp = padded_grid(grid, M)
    prefix, tokens = x[:, :P], x[:, P:].reshape(B, H, W, C)
    tokens = F.pad(tokens, (0, 0, 0, wp - W, 0, hp - H))  # [B, Hp, Wp, C]
    if shift:
        tokens = torch.roll(tokens, (-shift, -shift), dims=(1, 2))
    windows = window_partition(tokens, M)  # [B·nW, M², C]
    nw = windows.shape[0] // B
    if P:
        prefix_rep = prefix[:, None].expand(B, nw, P, C).reshape(B * nw, P, C)
        windows = torch.cat([prefix_rep, windows], dim=1)  # [B·nW, P + M², C]
    mask = window_mask(grid, M, shift, P)
    out = attn(windows, (M, M), mask=None if mask is None else mask.to(x.device, x.dtype))
    prefix_out = out[:, :P].reshape(B, nw, P, C).mean(dim=1)  # [B, P, C]
    tokens = window_reverse(out[:, P:], M, hp, wp)  # [B, Hp, Wp, C]
    if shift:
        tokens = torch.roll(tokens, (shift, shift), dims=(1, 2))
    tokens = tokens[:, :H, :W].reshape(B, H * W, C)
    return torch.cat([prefix_out, tokens], dim=1)
