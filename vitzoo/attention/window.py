"""Window multi-head self-attention with relative position bias (Swin W-MSA / SW-MSA).

Paper: Liu et al., "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows",
ICCV 2021, https://arxiv.org/abs/2103.14030. In a plain ViT this is ViTDet-style windowed
attention (Li et al., https://arxiv.org/abs/2203.16527).

The host block does the geometry (:func:`vitzoo.layers.window.windowed_call`): padding a grid the
window does not divide, the cyclic shift on alternate blocks (``shift: true``) and the partition.
This module sees window tokens ``[B·nW, P + M², C]`` plus the additive mask. A window larger than
the grid is clamped to the grid (as Swin does, which also disables the shift there).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from timm.layers import trunc_normal_

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, QKVAttention, check, check_positive, dense_attention, sdpa
from vitzoo.layers.window import num_windows, padded_grid


@dataclass
class WindowConfig:
    window_size: Optional[int] = None  # window side M in tokens; null = the model's window_size
    shift: bool = True  # odd blocks use shifted windows (SW-MSA), by M // 2
    pad: bool = True  # pad a grid that M does not divide; if false, such a grid is an error
    clamp: bool = True  # a window larger than the grid shrinks to the grid (Swin); if false it pads up

    def __post_init__(self):
        if self.window_size is not None:
            check_positive(self, "window_size")


def relative_position_index(window: int) -> Tensor:
    """``[M², M²]`` index into the ``(2M-1)²`` bias table for every pair of window positions."""
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)  # [M², M², 2]
    return rel[..., 0] * (2 * window - 1) + rel[..., 1]


@register_attention("window", WindowConfig)
class WindowAttention(QKVAttention):
    """W-MSA over windows of M×M tokens. Cost ``4NC² + 2M²NC`` with N the padded grid tokens.

    With P prefix tokens joining each of the nW windows (T = P + M² tokens per window) the cost is
    ``nW·(4TC² + 2T²C)``, i.e. the extra ``nW·(4PC² + 4PM²C + 2P²C)``.
    """

    formula = "4NC² + 2M²NC + nW·(4PC² + 4PM²C + 2P²C)"
    windowed = True
    takes_bias = True
    linear_cost = True

    def __init__(self, cfg: WindowConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        H, W = ctx.grid
        M = cfg.window_size or ctx.window
        self.window_size = min(M, H, W) if cfg.clamp else M
        check(cfg.pad or padded_grid(ctx.grid, self.window_size) == tuple(ctx.grid),
              f"attention.window_size={self.window_size} does not divide the {H}x{W} token grid; "
              f"set attention.pad=true or pick a divisor")
        M = self.window_size
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * M - 1) ** 2, self.num_heads))
        trunc_normal_(self.relative_position_bias_table, std=0.02)
        self.register_buffer("relative_position_index", relative_position_index(M), persistent=False)

    def shift_size(self, grid: Grid) -> int:
        """Shift used by an odd (shifted) block at ``grid``: M//2, or 0 when one window covers the grid."""
        return self.window_size // 2 if self.cfg.shift and min(grid) > self.window_size else 0

    def position_bias(self) -> Tensor:
        """``[h, T, T]`` relative position bias, zero on prefix rows and columns (T = P + M²)."""
        M2 = self.window_size ** 2
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]  # [M²·M², h]
        bias = bias.view(M2, M2, -1).permute(2, 0, 1)  # [h, M², M²]
        return F.pad(bias, (self.num_prefix, 0, self.num_prefix, 0))

    def attend_windows(self, x: Tensor, mask: Optional[Tensor], attend) -> Tensor:
        """Split heads, group windows per image and apply ``attend(q, k, v, bias)``.

        With a mask, q/k/v are viewed as ``[B, nW, h, T, d]`` so the ``[nW, h, T, T]`` bias+mask
        broadcasts over images instead of being copied B times.
        """
        q, k, v = self.split_heads(x)  # [B·nW, h, T, d]
        bias = self.position_bias().to(q.dtype)  # [h, T, T]
        if mask is not None:
            nw = mask.shape[0]
            q, k, v = (t.view(-1, nw, *t.shape[1:]) for t in (q, k, v))  # [B, nW, h, T, d]
            bias = bias[None] + mask[:, None]  # [nW, h, T, T]
        return self.merge_heads(attend(q, k, v, bias).flatten(0, -4))  # [B·nW, h, T, d] -> [B·nW, T, C]

    def forward(self, x: Tensor, grid: Grid, mask: Optional[Tensor] = None) -> Tensor:
        """Args: x: window tokens ``[B·nW, P + M², C]``; grid: (M, M); mask: ``[nW, T, T]`` or None."""
        p = self.attn_drop.p if self.training else 0.0
        return self.attend_windows(x, mask, lambda q, k, v, b: sdpa(q, k, v, attn_mask=b, dropout_p=p))

    def reference(self, x: Tensor, grid: Grid, mask: Optional[Tensor] = None) -> Tensor:
        return self.attend_windows(x, mask, lambda q, k, v, b: dense_attention(q, k, v, bias=b))

    def flops(self, grid: Optional[Grid] = None) -> int:
        """MACs for one image whose token grid is ``grid`` (partitioned into nW windows)."""
        grid = grid or self.grid
        nw = num_windows(grid, self.window_size)
        t = self.num_prefix + self.window_size ** 2  # tokens per window
        # qkv (3TC²) and output projection (TC²) per window
        proj = self.projection_flops(t)
        # QKᵀ: T·T·d per head and AV: T·T·d per head -> 2T²C per window
        attn = 2 * t * t * self.dim
        return nw * (proj + attn)

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        hp, wp = padded_grid(grid or self.grid, self.window_size)
        nw = (hp // self.window_size) * (wp // self.window_size)
        return {"N": hp * wp, "C": self.dim, "h": self.num_heads, "M": self.window_size, "P": self.num_prefix, "nW": nw}
