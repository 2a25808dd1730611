"""Shared helpers for fixed-length token mixers (parameters with a token axis of length N = P + H·W).

Used by ``mixer`` (MLP-Mixer), ``gmlp`` (spatial gating unit) and ``synthesizer``. Such a mixer is
built for the construction grid ``ctx.grid``; at another grid it raises a ConfigError unless its
config has ``interpolate: true``, in which case every token-axis parameter is resampled on the fly
with :func:`vitzoo.attention.functional.resample_tokens` (prefix entries kept, grid entries bilinearly
interpolated as an image).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from vitzoo.attention.base import Grid
from vitzoo.attention.functional import resample_tokens
from vitzoo.costs import Saved, itemsize


class TokenAxisMixin:
    """Mixin for a :class:`~vitzoo.attention.base.TokenMixer` with token-axis parameters.

    The host class provides ``grid``, ``num_prefix``, ``cfg.interpolate`` and ``check_grid``.
    """

    fixed_length = True

    def token_param(self, t: Tensor, grid: Grid, dim: int, mass: bool = False) -> Tensor:
        """``t`` with its token axis ``dim`` resampled from the construction grid to ``grid``.

        Args:
            t: a parameter whose axis ``dim`` has length ``P + H·W`` (construction grid).
            grid: the grid of this call; raises ConfigError when it differs and interpolation is off.
            dim: the token axis of ``t``.
            mass: the axis is summed over (an input axis of a token-to-token linear map). Its grid
                entries are then scaled by ``H·W / (H'·W')`` so that a smooth input gives the same
                output at every resolution (a sum over 4x as many tokens is not 4x larger).
        """
        self.check_grid(grid)
        grid = tuple(grid)
        if grid == self.grid:
            return t
        out = resample_tokens(t, self.grid, grid, self.num_prefix, dim)  # token axis now P + H'·W'
        if not mass:
            return out
        ratio = (self.grid[0] * self.grid[1]) / (grid[0] * grid[1])
        p, n = self.num_prefix, out.shape[dim]
        return torch.cat([out.narrow(dim, 0, p), out.narrow(dim, p, n - p) * ratio], dim=dim)

    def token_param_flops(self, numel: int, grid: Optional[Grid]) -> int:
        """Cost of :meth:`token_param` on a tensor of ``numel`` elements, as fvcore counts it: 4 per
        output element of the bilinear upsample (``aten::upsample_bilinear2d``) over the grid part of
        the token axis, 0 at the construction grid. Paid once per forward, independent of batch.
        """
        grid = tuple(grid or self.grid)
        if grid == self.grid:
            return 0
        rows = numel // (self.num_prefix + self.grid[0] * self.grid[1])  # vectors resampled
        return 4 * rows * grid[0] * grid[1]

    def token_param_memory(self, name: str, numel: int, grid: Grid, amp: Optional[torch.dtype]) -> list[Saved]:
        """What an op that saves a token-axis parameter (its :meth:`token_param`) keeps of it: nothing at the
        construction grid in fp32 (the parameter itself), its autocast copy under ``amp``, the resampled fp32
        tensor at another grid.

        Args:
            name: what the parameter is; numel: its elements at ``grid``; grid: the call's grid; amp: autocast dtype.
        """
        if amp is None and tuple(grid) == self.grid:
            return []
        what = "autocast copy" if amp is not None else "resampled"
        return [Saved(f"{name} ({what})", numel, itemsize(amp))]


def mix_tokens(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """Token-to-token linear map shared across channels: ``y[b, m, c] = Σₙ W[m, n]·x[b, n, c] + bias[m]``.

    Args:
        x: ``[B, N, C]``.
        weight: ``[M, N]``.
        bias: ``[M]`` or None.

    Returns ``[B, M, C]``; costs ``B·C·M·N`` multiply-adds (one ``aten::linear``).
    """
    return F.linear(x.transpose(1, 2), weight, bias).transpose(1, 2)  # [B, C, N] -> [B, C, M] -> [B, M, C]
