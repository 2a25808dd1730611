"""Base classes of the fixed patterns built from 2-D neighbourhoods (``local``, ``dilated``, ``global_tokens``,
``longformer``, ``multi_pattern``): each head group is a :class:`Neighbourhood` (or dense) and runs blocked
(halo) attention (:mod:`vitzoo.attention.sparse.halo`).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from vitzoo.attention.base import Grid, MixerContext, check_non_negative
from vitzoo.attention.sparse import flex
from vitzoo.attention.sparse.geometry import Neighbourhood, check_num_global, fit_dilation
from vitzoo.attention.sparse.halo import HaloGroup
from vitzoo.attention.sparse.memory import pattern_memory
from vitzoo.attention.sparse.pattern import HeadGroup, SparsePattern, SparsePatternAttention
from vitzoo.costs import Saved


class NeighbourhoodAttention(SparsePatternAttention):
    """Base of backends whose head groups each use a 2-D :class:`Neighbourhood` (or dense heads).

    Subclasses implement :meth:`head_patterns`: ``[(heads, Neighbourhood or None), ...]``.
    """

    uses_offsets = False  # halo groups build relative-position indices (``local`` with ``rel_pos_bias``)

    def head_patterns(self, grid: Grid) -> list[tuple[int, Optional[Neighbourhood]]]:  # pragma: no cover
        raise NotImplementedError

    def build_pattern(self, grid: Grid) -> SparsePattern:
        groups = []
        for heads, nbhd in self.head_patterns(grid):
            if heads:
                groups.append(
                    halo_group(heads, grid, nbhd, self.uses_offsets) if nbhd is not None else HeadGroup(heads)
                )
        return SparsePattern(grid, groups)

    def attend_memory(self, grid: Grid, batch: int, amp: Optional[torch.dtype]) -> list[Saved]:
        """The blocked path's saved tensors (:func:`vitzoo.attention.sparse.memory.pattern_memory`)."""
        return pattern_memory(self, grid, batch, amp)

    def flex_grid_mod(self, grid: Grid, device: Any) -> flex.GridMod:
        rows, cols = flex.neighbourhood_tables(self.head_patterns(grid), grid)  # [h, H, H], [h, W, W]
        return flex.axis_tables_mod(rows.to(device), cols.to(device), grid[1])

    def grid_mask(self, grid: Grid) -> Tensor:
        L = grid[0] * grid[1]
        masks = [
            (nbhd.mask(grid) if nbhd is not None else torch.ones(L, L, dtype=torch.bool)).expand(heads, L, L)
            for heads, nbhd in self.head_patterns(grid)
            if heads
        ]
        return torch.cat(masks, dim=0)  # [h, L, L]

    def halo_symbols(self, grid: Optional[Grid], nbhd: Neighbourhood, tag: str) -> dict[str, int]:
        """``L_<tag>``: query slots of the blocked grid, ``K_<tag>``: halo keys per block of ``nbhd`` at ``grid``."""
        group = halo_group(0, tuple(grid or self.grid), nbhd)
        return {f"L_{tag}": group.query_slots(), f"K_{tag}": group.halo_keys()}

    def dilation_at(self, grid: Optional[Grid] = None) -> Grid:
        """Per-axis dilation used at ``grid`` (for ``extra_repr``)."""
        return fit_dilation(getattr(self.cfg, "dilation", 1), self.cfg.kernel_size, grid or self.grid)


class GlobalNeighbourhoodAttention(NeighbourhoodAttention):
    """Neighbourhood heads plus ``attention.num_global`` learned global tokens (``global_tokens``, ``longformer``).

    The one place ``num_global`` is handled: checked against the grid, turned into the learned
    tokens of :class:`SparsePatternAttention`, and reported as ``g`` (with ``k``) in :meth:`symbols`.
    The config has ``kernel_size`` and ``num_global`` (checked with :func:`check_num_global_option`).
    Subclasses run their own checks before ``super().__init__`` and implement :meth:`head_patterns`.

    Args:
        cfg: the backend's config.
        ctx: the host's context.
    """

    def __init__(self, cfg: Any, ctx: MixerContext):
        check_num_global(cfg.num_global, ctx.grid)
        super().__init__(cfg, ctx, num_learned=cfg.num_global)
        self.setup()

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        return {**super().symbols(grid), "k": self.cfg.kernel_size, "g": self.num_learned}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kernel_size={self.cfg.kernel_size}, num_global={self.num_learned}"


def halo_group(heads: int, grid: Grid, nbhd: Neighbourhood, offsets: bool = False) -> HaloGroup:
    """The blocked-attention buffers of ``heads`` heads using ``nbhd`` at ``grid``
    (``offsets``: see :class:`HaloGroup`)."""
    return HaloGroup(heads, grid, nbhd.kernel, nbhd.dilations(grid), nbhd.border, offsets)


def check_num_global_option(cfg: Any) -> None:
    """Config check of ``attention.num_global`` (a non-negative integer; the grid bound comes at construction)."""
    check_non_negative(cfg, "num_global")
