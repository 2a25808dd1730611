"""Axial attention (``axial``): rows, then columns of the token grid.

Papers: Ho et al., "Axial Attention in Multidimensional Transformers", 2019,
https://arxiv.org/abs/1912.12180; Wang et al., "Axial-DeepLab", ECCV 2020, https://arxiv.org/abs/2003.07853.
One q/k/v projection; every grid token first attends to the tokens of its row (softmax over the W
row keys and the P prefix keys), then to the tokens of its column with the row pass's outputs as
values (softmax over the H column keys): two passes give every grid token the whole grid. Prefix
tokens (ViT's class token) attend to all N tokens. Cost N·(H + W); both passes run as fused
scaled-dot-product attention over batches of rows and columns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, QKVAttention
from vitzoo.attention.functional import sdpa


@dataclass
class AxialConfig:
    """Axial attention has no options (row pass, then column pass)."""


@register_attention("axial", AxialConfig)
class AxialAttention(QKVAttention):
    """Row attention, then column attention over the row outputs; cost :attr:`formula`.

    Args:
        cfg: AxialConfig.
        ctx: dims, heads, grid and prefix tokens from the host block.
    """

    formula = "4NC² + 2HW(H + W + P)C + 2PNC"

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        B, h, N, d = q.shape
        P, (H, W) = self.num_prefix, grid
        drop = self.attn_drop.p if self.training else 0.0

        def rows(t: Tensor) -> Tensor:
            return t[:, :, P:].reshape(B, h * H, W, d)  # [B, h·H, W, d]: one row per batch entry

        def prefix_per_row(t: Tensor) -> Tensor:
            return t[:, :, None, :P].expand(B, h, H, P, d).reshape(B, h * H, P, d)  # [B, h·H, P, d]

        k_row = torch.cat([prefix_per_row(k), rows(k)], dim=2)  # [B, h·H, P + W, d]
        v_row = torch.cat([prefix_per_row(v), rows(v)], dim=2)
        o = sdpa(rows(q), k_row, v_row, dropout_p=drop)  # [B, h·H, W, d]: 2W(P+W)d

        def cols(t: Tensor) -> Tensor:
            return t.reshape(B, h, H, W, d).transpose(2, 3).reshape(B, h * W, H, d)  # [B, h·W, H, d]

        o = sdpa(cols(rows(q)), cols(rows(k)), cols(o), dropout_p=drop)  # 2H·H·d
        o = o.reshape(B, h, W, H, d).transpose(2, 3).reshape(B, h, H * W, d)  # [B, h, HW, d]
        if not P:
            return o
        o_prefix = sdpa(q[:, :, :P], k, v, dropout_p=drop)  # [B, h, P, d]: 2PNd
        return torch.cat([o_prefix, o], dim=2)  # [B, h, N, d]

    def attend_flops(self, grid: Grid) -> int:
        H, W = grid
        P, C = self.num_prefix, self.dim
        # rows: HW queries × (W + P) keys, columns: HW queries × H keys, prefix: P queries × N keys;
        # each q·k and weights·v over d per head
        return 2 * H * W * (H + W + P) * C + 2 * P * self.seq_len(grid) * C

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        """Masked N×N softmax attention twice: row mask (own row + prefix), then column mask on the result."""
        P, (H, W) = self.num_prefix, grid
        N = P + H * W
        r = torch.full((N,), -1)
        c = torch.full((N,), -1)
        r[P:] = torch.arange(H * W) // W
        c[P:] = torch.arange(H * W) % W
        is_prefix = torch.arange(N) < P
        row_mask = (r[:, None] == r[None, :]) | is_prefix[None, :] | is_prefix[:, None]  # prefix queries: all
        col_mask = (c[:, None] == c[None, :]) & ~is_prefix[None, :]
        first = _masked_softmax_attention(q, k, v, row_mask.to(q.device), self.scale)
        second = _masked_softmax_attention(q, k, first, col_mask.to(q.device), self.scale)
        return torch.where(is_prefix[None, None, :, None].to(q.device), first, second)

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        h, w = grid or self.grid
        return {**super().symbols(grid), "H": h, "W": w, "P": self.num_prefix}


def _masked_softmax_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, scale: float) -> Tensor:
    """``softmax(QKᵀ·scale, where allowed)V`` with explicit exponentials; rows with no allowed key give 0."""
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    e = (s - s.amax(dim=-1, keepdim=True).clamp(min=torch.finfo(s.dtype).min)).exp()
    return torch.einsum("bhij,bhjd->bhid", e / e.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(s.dtype).tiny), v)
