"""Compressed (spatial-reduction) attention: keys and values from a strided convolution of the tokens.

Papers: Liu et al., "Generating Wikipedia by Summarizing Long Sequences" (memory-compressed
attention), ICLR 2018, https://arxiv.org/abs/1801.10198; in 2-D the spatial-reduction attention
(SRA) of PVT: Wang et al., "Pyramid Vision Transformer", ICCV 2021, https://arxiv.org/abs/2102.12122.

Queries are all N tokens. The grid tokens, as an ``[C, H, W]`` image, go through a ``r×r``
convolution with stride ``r`` and a LayerNorm (as in PVT), giving ``H'·W' = ⌈H/r⌉·⌈W/r⌉`` tokens
from which keys and values are projected; attention is ``softmax(QKᵀ/√d)V`` over those
``P + H'·W'`` keys (via SDPA: an ``N × N/r²`` problem, not ``N × N``). With ``reduction: 1`` there is
no convolution and no norm (PVT's last stage): plain MSA with separate q and kv projections.

Padding: a grid that r does not divide is zero-padded at the bottom/right (``pad: true``), so the
last row/column of reduced tokens sees partial windows (zeros elsewhere); with ``pad: false`` it is
a ConfigError naming ``attention.reduction``.

Prefix tokens (ViT's class token): queries like every token, and kept as extra keys/values
UNcompressed (not convolved, not normalised, projected by the same kv projection), in front of
the reduced grid tokens, so every token can still attend to the class token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, TokenMixer, check, check_positive
from vitzoo.attention.functional import dense_attention, sdpa
from vitzoo.costs import Saved, itemsize
from vitzoo.ops.sdpa import fp32_backward_workspace


@dataclass
class CompressedConfig:
    reduction: int = 2  # spatial reduction ratio r: keys/values from an r×r stride-r conv (N/r² keys)
    pad: bool = True  # zero-pad a grid that r does not divide; false = such a grid is an error

    def __post_init__(self):
        check_positive(self, "reduction")


@register_attention("compressed", CompressedConfig)
class CompressedAttention(TokenMixer):
    """Spatial-reduction attention; its cost is :attr:`formula` with R = H'W' reduced tokens
    (R = 0 terms for r = 1) and K = P + R keys.

    Args:
        cfg: :class:`CompressedConfig`.
        ctx: host dims; the construction grid is checked against ``pad``.
    """

    formula = "2NC² + R(r²C² + 5C) + 2KC² + 2NKC"

    def __init__(self, cfg: CompressedConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        self.reduction = cfg.reduction
        self.check_divides(ctx.grid)
        C = ctx.dim
        self.q = nn.Linear(C, C, bias=ctx.qkv_bias)
        self.kv = nn.Linear(C, 2 * C, bias=ctx.qkv_bias)
        if self.reduction > 1:
            self.sr = nn.Conv2d(C, C, kernel_size=self.reduction, stride=self.reduction)
            self.norm = nn.LayerNorm(C)
        self.attn_drop = nn.Dropout(ctx.attn_drop)
        self.proj = nn.Linear(C, C)
        self.proj_drop = nn.Dropout(ctx.proj_drop)

    def check_divides(self, grid: Grid) -> None:
        H, W = grid
        r = self.reduction
        check(
            self.cfg.pad or (H % r == 0 and W % r == 0),
            f"attention.reduction={r} does not divide the {H}x{W} token grid; set attention.pad=true or pick a divisor",
        )

    def reduced_grid(self, grid: Grid) -> Grid:
        return tuple(-(-s // self.reduction) for s in grid)

    def compress(self, x: Tensor, grid: Grid) -> Tensor:
        """``x[B, P + H·W, C] -> [B, P + H'·W', C]``: prefix tokens kept, grid tokens reduced."""
        if self.reduction == 1:
            return x
        self.check_divides(grid)
        B, _, C = x.shape
        H, W = grid
        hr, wr = self.reduced_grid(grid)
        prefix, tokens = x[:, : self.num_prefix], x[:, self.num_prefix :]
        img = tokens.transpose(1, 2).reshape(B, C, H, W)  # [B, C, H, W]
        img = F.pad(img, (0, wr * self.reduction - W, 0, hr * self.reduction - H))  # [B, C, H'r, W'r]
        reduced = self.norm(self.sr(img).flatten(2).transpose(1, 2))  # [B, H'·W', C]
        return torch.cat([prefix, reduced], dim=1)

    def split_heads(self, x: Tensor, grid: Grid) -> tuple[Tensor, Tensor, Tensor]:
        """``x[B, N, C] -> q[B, h, N, d]`` and ``k, v[B, h, K, d]`` from the compressed tokens."""
        (q,) = self.to_heads(self.q(x))  # [B, h, N, d]
        k, v = self.to_heads(self.kv(self.compress(x, grid)), 2)  # [B, K, 2C] -> 2 x [B, h, K, d]
        return q, k, v

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        q, k, v = self.split_heads(x, grid)
        return self.merge_heads(sdpa(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0))

    def reference(self, x: Tensor, grid: Grid) -> Tensor:
        """Keys/values written out: each reduced token is the conv applied to its r×r window by hand."""
        B, N, C = x.shape
        P, r = self.num_prefix, self.reduction
        (q,) = self.to_heads(x @ self.q.weight.T + (self.q.bias if self.q.bias is not None else 0))  # [B, h, N, d]
        if r == 1:
            keys = x
        else:
            H, W = grid
            hr, wr = self.reduced_grid(grid)
            img = x[:, P:].reshape(B, H, W, C)
            kernel = self.sr.weight.permute(2, 3, 1, 0)  # [r, r, C_in, C_out]
            reduced = []
            for i in range(hr):
                for j in range(wr):
                    acc = self.sr.bias.expand(B, C)
                    for di in range(r):
                        for dj in range(r):
                            if i * r + di < H and j * r + dj < W:  # outside the grid: zero padding
                                acc = acc + img[:, i * r + di, j * r + dj] @ kernel[di, dj]
                    reduced.append(acc)
            reduced = torch.stack(reduced, dim=1)  # [B, H'·W', C], row-major
            reduced = F.layer_norm(reduced, (C,), self.norm.weight, self.norm.bias, self.norm.eps)
            keys = torch.cat([x[:, :P], reduced], dim=1)
        kv = keys @ self.kv.weight.T + (self.kv.bias if self.kv.bias is not None else 0)
        k, v = self.to_heads(kv, 2)  # [B, K, 2C] -> 2 x [B, h, K, d]
        return self.merge_heads(dense_attention(q, k, v))

    def flops(self, grid: Optional[Grid] = None) -> int:
        grid = grid or self.grid
        n, c, r = self.seq_len(grid), self.dim, self.reduction
        reduced = 0 if r == 1 else self.reduced_grid(grid)[0] * self.reduced_grid(grid)[1]
        keys = n if r == 1 else self.num_prefix + reduced
        total = n * c * c  # q: N×C times C×C
        total += reduced * c * c * r * r  # sr conv: each of the R outputs is C_out × (C_in·r·r)
        total += 5 * reduced * c  # LayerNorm on reduced tokens, affine: 5 per element
        total += keys * c * 2 * c  # kv: K×C times C×2C
        total += 2 * n * keys * c  # QKᵀ and AV: per head N×K×d each
        total += n * c * c  # output projection: N×C times C×C
        return total

    def memory(self, grid: Optional[Grid] = None, batch: int = 1, amp: Optional[torch.dtype] = None,
               input_dtype: Optional[torch.dtype] = None) -> list[Saved]:
        """What a training forward keeps: the projections' and the convolution's inputs (autocast copies of them
        and of their weights under ``amp``), the norm's statistics and SDPA's q, k|v, output and log-sum-exp.

        With ``reduction: 1`` the q and kv projections take the same input: under ``amp`` each makes its own
        cast of an fp32 input (autocast caches casts of leaf tensors only, and a block's input is none); an input
        in the autocast dtype is the one storage both keep.

        Args:
            grid: token grid (default: the construction grid); batch: images; amp: autocast dtype or ``None``;
            input_dtype: the input's dtype (``None``: fp32).
        """
        grid = grid or self.grid
        B, n, C, h, r, size = batch, self.seq_len(grid), self.dim, self.num_heads, self.reduction, itemsize(amp)
        hr, wr = self.reduced_grid(grid)
        keys = n if r == 1 else self.num_prefix + hr * wr
        items = [Saved("q input", B * n * C, size)]  # x [B, N, C]
        if r > 1:
            items += [
                Saved("sr input (padded grid image)", B * C * hr * r * wr * r, size),  # [B, C, H'r, W'r]
                Saved("norm input (sr output)", B * C * hr * wr, size),  # [B, C, H'·W']
                Saved("norm mean (fp32)", B * hr * wr, 4), Saved("norm rstd (fp32)", B * hr * wr, 4),  # [B, H'·W', 1]
            ]
        if r > 1 or (amp is not None and (input_dtype or torch.float32) != amp):  # else kv saves q's input itself
            items.append(Saved("kv input", B * keys * C, size))  # [B, K, C]
        items += [
            Saved("q (projection output)", B * n * C, size),  # [B, N, C]
            Saved("k|v (projection output)", B * keys * 2 * C, size),  # [B, K, 2C]
            Saved("attention output", B * n * C, size,  # [B, h, N, d]; its fp32 backward on short key sequences
                  workspace=fp32_backward_workspace(B * h, n, keys, C // h, amp=amp)),
            Saved("row log-sum-exp (fp32)", B * h * n, 4),  # [B, h, N]
            Saved("proj input", B * n * C, size),  # [B, N, C]
        ]
        if amp is not None:
            items += [Saved("q weight (autocast copy)", C * C, size),  # [C, C]
                      Saved("kv weight (autocast copy)", 2 * C * C, size),  # [2C, C]
                      Saved("proj weight (autocast copy)", C * C, size)]  # [C, C]
            if r > 1:
                items.append(Saved("sr weight (autocast copy)", C * C * r * r, size))  # [C, C, r, r]
        return items

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        grid = grid or self.grid
        hr, wr = self.reduced_grid(grid)
        reduced = 0 if self.reduction == 1 else hr * wr
        keys = self.seq_len(grid) if self.reduction == 1 else self.num_prefix + reduced
        return {**super().symbols(grid), "r": self.reduction, "R": reduced, "K": keys}
