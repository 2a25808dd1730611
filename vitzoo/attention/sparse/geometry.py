"""Neighbourhood geometry of the fixed sparse-pattern backends: which grid tokens a query sees.

Index tables for Neighborhood Attention (each token's k×k window, shifted inward at the border) and
dilated / Longformer-style patterns, plus the one-line option checks they share. Pure functions of
the grid: :mod:`vitzoo.attention.sparse.halo` turns them into block, halo and mask buffers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from vitzoo.attention.base import Grid, check

BORDERS = ("shift", "mask")


# ----------------------------------------------------------------------------------------- checks
def check_odd_kernel(cfg: Any, name: str = "kernel_size") -> None:
    """``attention.<name>`` must be a positive odd integer (centred neighbourhoods)."""
    value = getattr(cfg, name)
    check(isinstance(value, int) and value > 0 and value % 2 == 1,
          f"attention.{name} must be a positive odd integer (got {value!r})")


def check_num_global(num_global: int, grid: Grid, name: str = "num_global") -> None:
    """Learned global tokens: at most H·W of them (more would make the pattern quadratic)."""
    H, W = grid
    check(num_global <= H * W, f"attention.{name}={num_global} exceeds the {H * W} tokens of the {H}x{W} grid; "
                               f"pick attention.{name} <= {H * W}")


def check_kernel_fits(kernel: int, grid: Grid, name: str = "kernel_size") -> None:
    """A ``kernel``×``kernel`` neighbourhood must fit in the token grid."""
    check(kernel <= min(grid), f"attention.{name}={kernel} is larger than the {grid[0]}x{grid[1]} token grid; "
                               f"pick attention.{name} <= {min(grid)}")


def fit_dilation(dilation: int, kernel: int, grid: Grid) -> tuple[int, int]:
    """Per-axis dilation actually used: DiNAT's rule ``min(dilation, side // kernel)`` (at least 1).

    A dilated k-neighbourhood spans about ``k·dilation`` tokens; on a small grid (Swin's last stage)
    the dilation shrinks so that the span fits, as DiNAT sets dilation = resolution // kernel.
    """
    return tuple(max(1, min(dilation, side // kernel)) for side in grid)


# ------------------------------------------------------------------------------ index and masks
def axis_index(n: int, kernel: int, dilation: int = 1, border: str = "shift") -> tuple[Tensor, Tensor]:
    """Key positions of every position along one axis of length ``n``.

    Args:
        n: axis length.
        kernel: keys per query along the axis (k).
        dilation: stride between keys (δ).
        border: ``"shift"``: Neighborhood Attention's rule, a query near the border keeps k keys by
            shifting its window inside the axis (dilated: inside its sub-lattice ``i mod δ``);
            needs ``k·δ <= n``. ``"mask"``: Longformer's rule, the window stays centred and keys
            outside the axis are invalid.

    Returns:
        ``idx[n, k]`` key positions (in range) and ``valid[n, k]`` booleans.
    """
    i, t = torch.arange(n), torch.arange(kernel)
    if border == "mask":
        idx = i[:, None] + dilation * (t - kernel // 2)  # [n, k]
        return idx.clamp(0, n - 1), (idx >= 0) & (idx < n)
    residue, pos = i % dilation, i // dilation
    sub_len = (n - residue + dilation - 1) // dilation  # length of the sub-lattice of this residue
    start = torch.minimum((pos - kernel // 2).clamp(min=0), sub_len - kernel)
    idx = residue[:, None] + dilation * (start[:, None] + t)  # [n, k]
    return idx, torch.ones_like(idx, dtype=torch.bool)


def axis_mask(n: int, kernel: int, dilation: int = 1, border: str = "shift") -> Tensor:
    """Boolean ``[n, n]`` form of :func:`axis_index`, written as range tests (for references)."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    same_lattice = (j - i) % dilation == 0
    if border == "mask":
        return same_lattice & ((j - i).abs() <= dilation * (kernel // 2))
    sub_len = (n - i % dilation + dilation - 1) // dilation
    start = torch.minimum((i // dilation - kernel // 2).clamp(min=0), sub_len - kernel)
    return same_lattice & (j // dilation >= start) & (j // dilation < start + kernel)


def neighbourhood_index(grid: Grid, kernel: Grid, dilation: Grid = (1, 1),
                        border: str = "shift") -> tuple[Tensor, Optional[Tensor]]:
    """2-D neighbourhoods as the outer product of the two axes.

    Args:
        grid: (H, W).
        kernel: (k_H, k_W) keys per axis.
        dilation: (δ_H, δ_W).
        border: see :func:`axis_index`.

    Returns:
        ``keys[H·W, k_H·k_W]`` raster ids of each token's keys and ``valid`` of the same shape,
        or None when every key is valid.
    """
    (H, W), (kh, kw) = grid, kernel
    rows, rows_ok = axis_index(H, kh, dilation[0], border)
    cols, cols_ok = axis_index(W, kw, dilation[1], border)
    keys = rows[:, None, :, None] * W + cols[None, :, None, :]  # [H, W, k_H, k_W]
    valid = rows_ok[:, None, :, None] & cols_ok[None, :, None, :]  # [H, W, k_H, k_W]
    keys, valid = keys.reshape(H * W, kh * kw), valid.reshape(H * W, kh * kw)  # [L, K]
    return keys, (None if bool(valid.all()) else valid)


def neighbourhood_mask(grid: Grid, kernel: Grid, dilation: Grid = (1, 1), border: str = "shift") -> Tensor:
    """Boolean ``[H·W, H·W]`` mask of :func:`neighbourhood_index` (for references)."""
    (H, W), (kh, kw) = grid, kernel
    rows = axis_mask(H, kh, dilation[0], border)  # [H, H]
    cols = axis_mask(W, kw, dilation[1], border)  # [W, W]
    return (rows[:, None, :, None] & cols[None, :, None, :]).reshape(H * W, H * W)  # [H, W, H, W] -> [L, L]


@dataclass(frozen=True)
class Neighbourhood:
    """One head group's 2-D neighbourhood pattern.

    Args:
        kernel: side k of the neighbourhood (odd).
        dilation: requested dilation δ (fitted per grid with :func:`fit_dilation`).
        border: ``"shift"`` (Neighborhood Attention) or ``"mask"`` (Longformer).
    """

    kernel: int
    dilation: int = 1
    border: str = "shift"

    def dilations(self, grid: Grid) -> Grid:
        """Per-axis dilation at ``grid`` (raises the kernel-size ConfigError if k does not fit)."""
        check_kernel_fits(self.kernel, grid)
        return fit_dilation(self.dilation, self.kernel, grid)

    def mask(self, grid: Grid) -> Tensor:
        return neighbourhood_mask(grid, (self.kernel, self.kernel), self.dilations(grid), self.border)


# -------------------------------------------------------------------------------- index buffers
