"""Window multi-head self-attention with relative position bias (Swin W-MSA / SW-MSA).

Paper: Liu et al., "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows",
ICCV 2021, https://arxiv.org/abs/2103.14030. In a plain ViT this is ViTDet-style windowed
attention (Li et al., https://arxiv.org/abs/2203.16527).

Like every mixer it is called as ``attn(x[B, P + H·W, C], grid)`` and owns its geometry:

* Padding: a grid the window does not divide is padded at the bottom/right; padding slots are
  masked out as keys (unlike the original Swin code, which lets real tokens attend to zero tokens
  there) and cropped from the output, so what they hold does not matter.
* Shift: a block built with ``MixerContext.shifted`` (Swin's odd blocks) rolls the padded grid by
  ``-M//2`` and masks pairs of tokens from different regions of the un-rolled image, as Swin does.
* Prefix tokens (ViT's class token) join every window as extra queries and keys; their outputs are
  averaged over the windows, so patch tokens see the class token and it sees every patch.
* A window larger than the grid is clamped to the grid (as Swin does, which also disables the shift).

The additive mask of the construction grid is a non-persistent buffer built once (it follows
``.to(device)``, ``torch.export`` and ``torch.compile``); another grid builds its mask on the fly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, QKVAttention, check, check_positive
from vitzoo.attention.functional import dense_attention, sdpa
from vitzoo.costs import Saved, itemsize
from vitzoo.ops import dispatch
from vitzoo.ops.window import keeps_probs, window_core


@dataclass
class WindowConfig:
    window_size: Optional[int] = None  # window side M in tokens; null = the model's window_size
    shift: bool = True  # odd blocks use shifted windows (SW-MSA), by M // 2
    pad: bool = True  # pad a grid that M does not divide; if false, such a grid is an error
    clamp: bool = True  # a window larger than the grid shrinks to the grid (Swin); if false it pads up

    def __post_init__(self):
        if self.window_size is not None:
            check_positive(self, "window_size")


# ------------------------------------------------------------------------------------------ geometry

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


def window_index(grid: Grid, window: int, shift: int, num_prefix: int,
                 device: Optional[torch.device] = None) -> tuple[Tensor, Tensor]:
    """Which token each window slot reads and where each token's output lies (pad, roll and partition in one).

    Returns:
        ``gather[nW, P + M²]``: the token (into the ``P + H·W`` tokens) each slot of the windows of the padded
        map rolled by ``-shift`` reads: each window's P prefix slots first (tokens 0..P-1), then its M² grid
        slots; padding slots hold -1 (they are masked as keys and their outputs are dropped).
        ``scatter[H·W]``: each grid token's slot in the windows' flattened slots ``[nW·(P + M²)]``.
    """
    H, W = grid
    hp, wp = padded_grid(grid, window)
    r = (torch.arange(hp, device=device) + shift) % hp  # padded-map row at each rolled row
    c = (torch.arange(wp, device=device) + shift) % wp
    real = (r[:, None] < H) & (c[None, :] < W)  # [Hp, Wp]
    token = torch.where(real, num_prefix + r[:, None] * W + c[None, :], -1)  # [Hp, Wp] (padding: -1)
    gather = window_partition(token[None, :, :, None], window).squeeze(-1)  # [nW, M²]
    prefix = torch.arange(num_prefix, device=device).expand(gather.shape[0], -1)  # [nW, P]
    gather = torch.cat([prefix, gather], dim=1)  # [nW, P + M²]
    grid_slot = gather.flatten() >= num_prefix
    scatter = torch.empty(H * W, dtype=torch.long, device=device)
    scatter[gather.flatten()[grid_slot] - num_prefix] = torch.arange(gather.numel(), device=device)[grid_slot]
    return gather, scatter


def window_mask(grid: Grid, window: int, shift: int, num_prefix: int,
                device: Optional[torch.device] = None) -> Optional[Tensor]:
    """Additive mask ``[nW, P + M², P + M²]`` (0 allowed, -inf masked), or None when nothing is masked.

    Masks keys that are padding and, with a shift, pairs of tokens from different image regions.
    """
    H, W = grid
    hp, wp = padded_grid(grid, window)
    if shift == 0 and (hp, wp) == (H, W):
        return None
    region = torch.zeros(1, hp, wp, 1, device=device)
    if shift:  # Swin's 3x3 regions of the rolled image
        cuts = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
        for i, (hs, ws) in enumerate((a, b) for a in cuts for b in cuts):
            region[:, hs, ws, :] = i
    pad = torch.zeros(1, hp, wp, 1, dtype=torch.bool, device=device)
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
    blocked &= ~torch.eye(blocked.shape[-1], dtype=torch.bool, device=device)  # a padded query keeps itself
    return torch.zeros(blocked.shape, device=device).masked_fill(blocked, float("-inf"))


def relative_position_index(window: int) -> Tensor:
    """``[M², M²]`` index into the ``(2M-1)²`` bias table for every pair of window positions."""
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)  # [M², M², 2]
    return rel[..., 0] * (2 * window - 1) + rel[..., 1]


# ----------------------------------------------------------------------------------------- the mixer

@register_attention("window", WindowConfig)
class WindowAttention(QKVAttention):
    """W-MSA over windows of M×M tokens (SW-MSA when the block is built ``shifted``); cost: :attr:`formula`
    (projections of the N = P + H·W tokens; P prefix tokens join each of the nW windows, T = P + M² tokens
    per window)."""

    formula = "4NC² + 2nW·T²C"
    linear_cost = True

    def __init__(self, cfg: WindowConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        H, W = ctx.grid
        M = cfg.window_size or ctx.window
        self.window_size = min(M, H, W) if cfg.clamp else M
        self.shifted = ctx.shifted
        check(cfg.pad or padded_grid(ctx.grid, self.window_size) == tuple(ctx.grid),
              f"attention.window_size={self.window_size} does not divide the {H}x{W} token grid; "
              f"set attention.pad=true or pick a divisor")
        M = self.window_size
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * M - 1) ** 2, self.num_heads))
        trunc_normal_(self.relative_position_bias_table, std=0.02)
        self.register_buffer("relative_position_index", relative_position_index(M), persistent=False)
        self.register_buffer("attn_mask", self.build_mask(self.grid), persistent=False)  # [nW, T, T] or None
        gather, scatter = self.build_index(self.grid)
        self.register_buffer("gather_index", gather, persistent=False)  # [nW, P + M²]
        self.register_buffer("scatter_index", scatter, persistent=False)  # [H·W]

    def shift_size(self, grid: Grid) -> int:
        """Cyclic shift at ``grid``: M//2 in a shifted block, 0 when unshifted or one window covers the grid."""
        return self.window_size // 2 if self.cfg.shift and self.shifted and min(grid) > self.window_size else 0

    def build_mask(self, grid: Grid, device: Optional[torch.device] = None) -> Optional[Tensor]:
        """The additive padding/shift mask ``[nW, P + M², P + M²]`` at ``grid`` (None: nothing masked)."""
        return window_mask(tuple(grid), self.window_size, self.shift_size(grid), self.num_prefix, device)

    def build_index(self, grid: Grid, device: Optional[torch.device] = None) -> tuple[Tensor, Tensor]:
        """:func:`window_index` at ``grid``: the slots' tokens ``[nW, P + M²]`` and the grid tokens' slots ``[H·W]``."""
        return window_index(tuple(grid), self.window_size, self.shift_size(grid), self.num_prefix, device)

    def plain_partition(self, grid: Grid) -> Optional[tuple[int, int, int]]:
        """(H, W, M) when the windows at ``grid`` just tile it (no shift, padding or prefix tokens), else None."""
        M = self.window_size
        plain = not self.num_prefix and not self.shift_size(grid) and padded_grid(grid, M) == tuple(grid)
        return (*grid, M) if plain else None

    def position_bias(self) -> Tensor:
        """``[h, T, T]`` relative position bias, zero on prefix rows and columns (T = P + M²)."""
        M2 = self.window_size ** 2
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]  # [M²·M², h]
        bias = bias.view(M2, M2, -1).permute(2, 0, 1)  # [h, M², M²]
        return F.pad(bias, (self.num_prefix, 0, self.num_prefix, 0)) if self.num_prefix else bias

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        """Args: x: ``[B, P + H·W, C]`` (prefix tokens first); grid: (H, W). Returns ``[B, P + H·W, C]``.

        The q/k/v projection takes the tokens in their order (it saves ``x`` itself for its weight
        gradient) and the output projection the windows' outputs back in token order. On the CPU without
        attention dropout (training, or inference of enough windows: eager)
        :func:`~vitzoo.ops.window.window_core` reads the windows' q/k/v block by block;
        elsewhere (CUDA,
        dropout, tracing, compiling, small inference calls) :meth:`attend_windows` does it with SDPA.
        """
        own = tuple(grid) == self.grid
        mask = self.attn_mask if own else self.build_mask(grid, x.device)
        gather, scatter = (self.gather_index, self.scatter_index) if own else self.build_index(grid, x.device)
        qkv = self.qkv(x)  # [B, N, 3C]
        bias = self.position_bias()  # [h, T, T]
        p = self.attn_drop.p if self.training else 0.0
        if dispatch.select("window_attention", qkv, p, gather.shape[0] * self.num_heads) == "cpu_core":
            out = window_core(
                qkv, gather, self.num_prefix, bias, mask, self.num_heads, self.scale, self.plain_partition(grid)
            )  # [B, N, C]
        else:
            out = self.attend_windows(qkv, gather, scatter, bias, mask, p)
        return self.proj_drop(self.proj(out))

    def attend_windows(
        self, qkv: Tensor, gather: Tensor, scatter: Tensor, bias: Tensor, mask: Optional[Tensor], p: float
    ) -> Tensor:
        """Window attention with SDPA: ``qkv[B, N, 3C]`` -> merged heads ``[B, N, C]`` in token order.

        Args:
            qkv: the tokens' fused projection. gather, scatter: :meth:`build_index`'s indices. bias: ``[h, T, T]``.
            mask: ``[nW, T, T]`` or None. p: attention dropout.

        SDPA always gets 4-D q/k/v and a 4-D mask (5-D inputs or a 3-D mask send it to its slow math path on
        CPU). With a mask, the windows are folded into the head axis, q/k/v ``[B, nW·h, T, d]``, so the
        ``[1, nW·h, T, T]`` bias+mask broadcasts over images instead of being copied B times.
        """
        B, _, C3 = qkv.shape
        (nw, t), P = gather.shape, self.num_prefix
        windows = qkv.index_select(1, gather.clamp(min=0).flatten()).view(B * nw, t, C3)  # pad, roll, partition
        q, k, v = self.to_heads(windows, 3)  # [B·nW, h, T, d]
        bias = bias.to(q.dtype)
        if mask is None:
            o = sdpa(q, k, v, attn_mask=bias[None], dropout_p=p)  # bias [1, h, T, T]
        else:
            h, d = q.shape[1], q.shape[3]
            q, k, v = (z.reshape(B, nw * h, t, d) for z in (q, k, v))  # [B, nW·h, T, d]
            bias = (bias[None] + mask[:, None].to(q.dtype)).reshape(1, nw * h, t, t)  # [1, nW·h, T, T]
            o = sdpa(q, k, v, attn_mask=bias, dropout_p=p).reshape(B * nw, h, t, d)  # [B·nW, h, T, d]
        o = o.transpose(1, 2).reshape(B, nw * t, -1)  # [B, nW·T, C]
        tokens = o.index_select(1, scatter)  # un-roll, crop: [B, H·W, C]
        if not P:
            return tokens
        prefix_out = o.view(B, nw, t, -1)[:, :, :P].mean(dim=1)  # [B, P, C]
        return torch.cat([prefix_out, tokens], dim=1)

    def attend_memory(self, grid: Grid, batch: int, amp: Optional[torch.dtype]) -> list[Saved]:
        """What the windows' attention keeps in a training step on the CPU, where ``window_attention`` dispatches
        to :class:`~vitzoo.ops.window.WindowCore` (attention dropout takes the SDPA form, which this formula does
        not cover: a one-line ConfigError). Args as :meth:`QKVAttention.attend_memory`."""
        nw, t, h, C, size = num_windows(grid, self.window_size), self.num_prefix + self.window_size ** 2, \
            self.num_heads, self.dim, itemsize(amp)
        with torch.enable_grad():  # the dispatch of a training call (a gradient-carrying qkv on the CPU)
            qkv = torch.zeros((), requires_grad=True).expand(batch, self.seq_len(grid), 3 * C)  # [B, N, 3C]
            path = dispatch.select("window_attention", qkv, self.attn_drop.p, nw * h)
        check(path == "cpu_core", f"attention=window: memory() covers the CPU core only, not the SDPA form that "
                                  f"model.attn_drop_rate={self.attn_drop.p} takes")
        masked = self.shift_size(grid) > 0 or padded_grid(grid, self.window_size) != tuple(grid)
        stats = ("probabilities", t) if keeps_probs(t, self.head_dim) else ("row log-sum-exp", 1)
        items = [
            Saved("windows' q|k|v heads", 3 * batch * nw * h * t * self.head_dim, size),  # [3, B·nW·h, T, d]
            Saved("score base (bias + mask)", (nw if masked else 1) * h * t * t, 4),  # [nW or 1, h, T, T] fp32
            Saved(f"{stats[0]} (fp32)", batch * nw * h * t * stats[1], 4),  # [B·nW·h, T, T or 1]
        ]
        if self.plain_partition(grid) is None:  # outputs written through rows: one spare row in proj's input
            items.append(Saved("proj input's spare row (prefix and padding slots)", C, size))  # [1, C]
        return items

    def reference(self, x: Tensor, grid: Grid) -> Tensor:
        """Dense ``softmax(QKᵀ/√d + B)V`` over all ``P + H·W`` tokens, its allowed pairs derived from
        token coordinates (window and Swin region in the rolled, padded frame), sharing no geometry
        code with :meth:`forward`. Prefix queries average one softmax per window."""
        q, k, v = self.split_heads(x)  # [B, h, N, d]
        P, M, s = self.num_prefix, self.window_size, self.shift_size(grid)
        hp, wp = padded_grid(grid, M)
        ii, jj = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
        r, c = ((ii - s) % hp).flatten(), ((jj - s) % wp).flatten()  # rolled coordinates of real tokens
        win = (r // M) * (wp // M) + c // M  # [HW] window id
        band = lambda t, n: (t >= n - M).long() + (t >= n - s).long() if s else torch.zeros_like(t)  # noqa: E731
        region = band(r, hp) * 3 + band(c, wp)
        same = (win[:, None] == win[None, :]) & (region[:, None] == region[None, :])  # [HW, HW]
        rel = ((r % M)[:, None] - (r % M)[None, :] + M - 1) * (2 * M - 1) + (c % M)[:, None] - (c % M)[None, :] + M - 1
        bias = F.pad(self.relative_position_bias_table[rel].permute(2, 0, 1), (P, 0))  # [h, HW, P + HW]
        allowed = F.pad(same, (P, 0), value=True)  # [HW, P + HW]: the prefix is always a key
        out = dense_attention(q[:, :, P:], k, v, allowed=allowed, bias=bias)  # [B, h, HW, d]
        if P:
            in_win = F.pad(
                win[None, :] == torch.arange(num_windows(grid, M))[:, None], (P, 0), value=True
            )  # [nW, P+HW]
            qp = q[:, :, None, :P].expand(-1, -1, in_win.shape[0], -1, -1)  # [B, h, nW, P, d]
            pre = dense_attention(qp, k[:, :, None], v[:, :, None], allowed=in_win[:, None])  # [B, h, nW, P, d]
            out = torch.cat([pre.mean(dim=2), out], dim=2)
        return self.merge_heads(out)

    def flops(self, grid: Optional[Grid] = None) -> int:
        """MACs for one image whose token grid is ``grid`` (partitioned into nW windows of T = P + M² slots)."""
        grid = grid or self.grid
        nw = num_windows(grid, self.window_size)
        t = self.num_prefix + self.window_size**2  # tokens per window
        # qkv (3NC²) and output projection (NC²) of the N = P + H·W tokens
        proj = self.projection_flops(self.seq_len(grid))
        # QKᵀ: T·T·d per head and AV: T·T·d per head -> 2T²C per window
        return proj + nw * 2 * t * t * self.dim

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        grid = grid or self.grid
        return {
            "N": self.seq_len(grid),
            "C": self.dim,
            "h": self.num_heads,
            "M": self.window_size,
            "P": self.num_prefix,
            "nW": num_windows(grid, self.window_size),
            "T": self.num_prefix + self.window_size**2,
        }
