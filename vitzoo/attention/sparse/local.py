"""2-D neighbourhood attention (``local``) and its dilated form (``dilated``).

Papers: Hassani et al., "Neighborhood Attention Transformer", CVPR 2023,
https://arxiv.org/abs/2204.07143 (``local``); Hassani & Shi, "Dilated Neighborhood Attention
Transformer", arXiv 2022, https://arxiv.org/abs/2209.15001 (``dilated``).

Each grid token attends to the k×k tokens around it. Near the border the neighbourhood is shifted
to stay inside the grid, so every token has exactly k² keys (as NA does, not zero-padding). With
dilation δ the neighbourhood takes every δ-th token: token (i, j) attends within its sub-lattice
``(i mod δ, j mod δ)``, shifted at the border inside that sub-lattice (DiNAT). On a grid too small
for ``k·δ`` the dilation shrinks per axis to ``side // k`` (DiNAT's rule; at least 1), so the
default builds on Swin's 4×4 stage. A kernel larger than the grid is an error (no clamping):
``attention.kernel_size`` must be odd and at most the grid's shorter side.

Prefix tokens (ViT's class token) are global: they attend to every token, and every token attends
to them on top of its k² neighbours. The fast path is blocked (halo) attention: blocks of queries
score the K keys of their halo with dense matmuls and an exact mask (each query keeps its k²
neighbours), ``[B, h, blocks, S, P + K]``; see :mod:`vitzoo.attention.sparse.halo`. Every query slot
scores all K halo keys, so the cost counts K (not k²) keys per query.

``attention.rel_pos_bias`` adds NAT's relative position bias: a learned ``(2k−1)×(2k−1)`` table
per head indexed by the key's offset from the query, added to the neighbourhood scores (not to the
prefix keys). The reference adds the same table densely.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from timm.layers import trunc_normal_
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, check
from vitzoo.attention.sparse import flex
from vitzoo.attention.sparse.geometry import Neighbourhood, check_odd_kernel
from vitzoo.attention.sparse.halo import HaloGroup
from vitzoo.attention.sparse.neighbourhood import NeighbourhoodAttention


@dataclass
class LocalConfig:
    kernel_size: int = 3  # neighbourhood side k (odd, <= the grid's shorter side)
    rel_pos_bias: bool = True  # NAT's relative position bias (the paper's): a learned (2k-1)² table per head
    impl: str = "auto"  # auto (flex on CUDA, blocked elsewhere), blocked (halo/gathered) or flex (FlexAttention)

    def __post_init__(self):
        check_odd_kernel(self)
        flex.check_impl(self)
        check_rel_pos_bias(self)


def check_rel_pos_bias(cfg) -> None:
    """``attention.rel_pos_bias`` is a bool.

    Args:
        cfg: a config with ``rel_pos_bias``.
    """
    check(isinstance(cfg.rel_pos_bias, bool), f"attention.rel_pos_bias must be true or false "
                                              f"(got {cfg.rel_pos_bias!r})")



@register_attention("local", LocalConfig)
class LocalAttention(NeighbourhoodAttention):
    """Neighbourhood attention over k×k tokens.

    Its cost is :attr:`formula` with P prefix tokens, L_b query slots of the blocked grid (H·W plus
    padding) and K_b halo keys per block: every grid query slot scores its block's K_b halo keys
    (masked to its k² neighbours) plus P prefix keys, prefix queries score all N keys.

    Args:
        cfg: :class:`LocalConfig`.
        ctx: the host's context.
    """

    formula = "4NC² + 2(K_b + P)L_bC + 2PNC"

    def __init__(self, cfg: LocalConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        self.uses_offsets = cfg.rel_pos_bias
        self.rel_pos_bias = None
        if self.uses_offsets:
            span = 2 * cfg.kernel_size - 1
            self.rel_pos_bias = nn.Parameter(torch.zeros(self.num_heads, span, span))  # [h, 2k-1, 2k-1]
            trunc_normal_(self.rel_pos_bias, std=0.02)
        self.setup()

    def halo_bias(self, group: HaloGroup, heads: slice) -> Optional[tuple[Tensor, Tensor]]:
        """The relative position bias of each (query slot, halo slot): the heads' table ``[heads, (2k-1)²]`` and
        the entry ``group.rel[blocks, S, K]`` each slot reads."""
        if self.rel_pos_bias is None:
            return None
        return self.rel_pos_bias[heads].flatten(1), group.rel  # [heads, 2k-1, 2k-1] -> [heads, (2k-1)²]

    def offset_tables(self, grid: Grid) -> tuple[Tensor, Tensor]:
        """Per-axis relative offsets ``(key - query) // δ + k - 1`` clamped to ``0..2k-2``: ``[H, H]``, ``[W, W]``."""
        k, (H, W), (dh, dw) = self.cfg.kernel_size, grid, self.dilation_at(grid)
        rows = ((torch.arange(H)[None, :] - torch.arange(H)[:, None]) // dh + k - 1).clamp(0, 2 * k - 2)  # [H, H]
        cols = ((torch.arange(W)[None, :] - torch.arange(W)[:, None]) // dw + k - 1).clamp(0, 2 * k - 2)  # [W, W]
        return rows, cols

    def grid_bias(self, grid: Grid) -> Optional[Tensor]:
        """Reference: the bias of every (grid query, grid key) pair from their coordinates, ``[h, L, L]``."""
        if self.rel_pos_bias is None:
            return None
        (H, W), (rows, cols) = grid, self.offset_tables(grid)
        bias = self.rel_pos_bias[:, rows[:, None, :, None], cols[None, :, None, :]]  # [h, H, W, H, W]
        return bias.reshape(self.num_heads, H * W, H * W)

    def flex_grid_bias(self, grid: Grid, device) -> Optional[flex.GridMod]:
        """Flex path: the bias of a grid pair read from the live table through the offset tables."""
        if self.rel_pos_bias is None:
            return None
        rows, cols = (t.to(device) for t in self.offset_tables(grid))
        W, table = grid[1], self.rel_pos_bias  # [h, 2k-1, 2k-1]

        def bias(h, qi, ki):
            return table[h, rows[qi // W, ki // W], cols[qi % W, ki % W]]
        return bias

    def head_patterns(self, grid: Grid) -> list[tuple[int, Optional[Neighbourhood]]]:
        return [(self.num_heads, Neighbourhood(self.cfg.kernel_size, getattr(self.cfg, "dilation", 1)))]

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        nbhd = self.head_patterns(grid or self.grid)[0][1]
        return {**super().symbols(grid), "k": self.cfg.kernel_size, **self.halo_symbols(grid, nbhd, "b")}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kernel_size={self.cfg.kernel_size}, dilation={self.dilation_at()}"


