"""Axial attention (``axial``): an attention layer along the rows, then one along the columns of the token grid.

Papers: Ho et al., "Axial Attention in Multidimensional Transformers", 2019,
https://arxiv.org/abs/1912.12180; Wang et al., "Axial-DeepLab: Stand-Alone Axial-Attention for Panoptic
Segmentation", ECCV 2020, https://arxiv.org/abs/2003.07853.

``projections: separate`` (default, the papers' form): two attention passes, each with its own Q/K/V
projection. The row pass projects the input (``qkv``) and every grid token attends to the W tokens of its
row; its per-head outputs, concatenated, are the input of the column pass, which projects them again
(``qkv_col``) and lets every grid token attend to the H tokens of its column; one output projection
(``proj``) follows. Two passes give every grid token the whole grid.

``projections: shared``: one q/k/v projection for both passes; the column pass scores the same queries and
keys along the columns and reads the row pass's outputs as its values (no second projection).

Prefix tokens (ViT's class token): in every pass a grid token also attends to the P prefix tokens (softmax
over its W or H line keys and the P prefix keys) and each prefix token attends to all N tokens, so the
class token takes part in both passes like a global token of each. With ``shared``, grid tokens score the
prefix keys in the row pass only and a prefix token's output is its row-pass read of all N tokens.

Both passes run as fused scaled-dot-product attention over batches of rows and of columns; cost
N·(H + W) per head and channel, :attr:`AxialAttention.formula`. With ``separate`` projections, CPU training runs
each pass as one autograd node (:mod:`vitzoo.ops.axial`) that keeps for backward only the pass's q|k|v projection
output, its output (the next projection's input) and the log-sum-exp. Where a pass runs in several fused calls
(large grids: :meth:`AxialAttention.recomputes`), its node keeps the projection's input in place of the q|k|v
and projects again in backward (3NC² multiply-adds per pass), so the layer keeps less than ``global``'s.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, QKVAttention, check
from vitzoo.attention.functional import sdpa
from vitzoo.costs import Saved, itemsize
from vitzoo.ops import axial as axial_ops
from vitzoo.ops import dispatch
from vitzoo.ops.sdpa import fp32_backward_workspace

PROJECTIONS = ("separate", "shared")


@dataclass
class AxialConfig:
    projections: str = "separate"  # separate: each pass its own Q/K/V (the papers); shared: one Q/K/V for both

    def __post_init__(self):
        check(self.projections in PROJECTIONS,
              f"attention.projections must be one of {', '.join(PROJECTIONS)} (got {self.projections!r})")


@register_attention("axial", AxialConfig)
class AxialAttention(QKVAttention):
    """Row attention, then column attention over the row outputs; cost :attr:`formula` (``separate``).

    ``qkv`` projects the row pass's q/k/v; with ``separate`` projections ``qkv_col`` projects the column pass's
    from the row pass's concatenated head outputs.

    Args:
        cfg: AxialConfig.
        ctx: dims, heads, grid and prefix tokens from the host block.
    """

    formula = "7NC² + 2HW(H + W + 2P)C + 4PNC"

    def __init__(self, cfg: AxialConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        self.separate = cfg.projections == "separate"
        if self.separate:
            self.qkv_col = nn.Linear(ctx.dim, 3 * ctx.dim, bias=ctx.qkv_bias)

    # ------------------------------------------------------------------------------------ fast path

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        if not self.separate:
            return super().forward(x, grid)
        y = self.line_pass(x, self.qkv, grid, rows=True)  # [B, N, C]: heads concatenated, the column pass's input
        return self.proj_drop(self.proj(self.line_pass(y, self.qkv_col, grid, rows=False)))

    def line_pass(self, x: Tensor, projection: nn.Linear, grid: Grid, rows: bool) -> Tensor:
        """One ``separate`` pass from its q|k|v projection's input: :func:`vitzoo.ops.axial.line_pass` where
        :mod:`vitzoo.ops.dispatch` picks it (``axial_pass``), :func:`vitzoo.ops.axial.projected_line_pass` there
        when the pass runs in several calls (:meth:`recomputes`), else :meth:`line_attention`.

        Args:
            x: ``[B, N, C]``, prefix tokens first.
            projection: the pass's q|k|v projection (``qkv`` or ``qkv_col``).
            grid: the token grid (H, W).
            rows: attend along the rows (else along the columns).

        Returns:
            ``[B, N, C]``: the heads' outputs side by side.
        """
        drop = self.attn_drop.p if self.training else 0.0
        if dispatch.select("axial_pass", x, projection.weight, drop) == "autograd_function":
            if self.recomputes(grid, rows):
                return axial_ops.projected_line_pass(x, projection.weight, projection.bias, self.num_heads, grid,
                                                     self.num_prefix, rows)
            return axial_ops.line_pass(projection(x), self.num_heads, grid, self.num_prefix, rows)
        B, N, _ = x.shape
        o = self.line_attention(*self.to_heads(projection(x), 3), grid, rows)  # [B, h, N, d]
        return o.transpose(1, 2).reshape(B, N, self.dim)  # [B, N, C]

    def recomputes(self, grid: Grid, rows: bool) -> bool:
        """Whether CPU training's pass node keeps its projection's input in place of its q|k|v and projects
        again in backward: where the pass runs in several fused calls (:func:`vitzoo.ops.axial.lines_per_call`),
        that is at grids whose q|k|v would dominate the layer's memory.

        Args:
            grid: the token grid (H, W); rows: the row pass (else the column pass).
        """
        lines, length = grid if rows else grid[::-1]
        return axial_ops.lines_per_call(self.dim, length, self.num_prefix) < lines

    def line_attention(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid, rows: bool) -> Tensor:
        """One axial pass: each grid token attends to its row (``rows``) or column plus the prefix tokens, each
        prefix token to all N tokens.

        Args:
            q, k, v: ``[B, h, N, d]``, prefix tokens first.
            grid: the token grid (H, W).
            rows: attend along the rows (else along the columns).

        Returns:
            ``[B, h, N, d]``.
        """
        B, h, N, d = q.shape
        P, (H, W) = self.num_prefix, grid
        lines, length = (H, W) if rows else (W, H)
        drop = self.attn_drop.p if self.training else 0.0

        def per_line(t: Tensor) -> Tensor:
            t = t[:, :, P:].reshape(B, h, H, W, d)  # [B, h, H, W, d]
            return (t if rows else t.transpose(2, 3)).reshape(B, h * lines, length, d)  # [B, h·lines, length, d]

        k_line, v_line = per_line(k), per_line(v)
        if P:
            def prefix(t: Tensor) -> Tensor:
                return t[:, :, None, :P].expand(B, h, lines, P, d).reshape(B, h * lines, P, d)  # [B, h·lines, P, d]

            k_line = torch.cat([prefix(k), k_line], dim=2)  # [B, h·lines, P + length, d]
            v_line = torch.cat([prefix(v), v_line], dim=2)
        o = sdpa(per_line(q), k_line, v_line, dropout_p=drop)  # [B, h·lines, length, d]: 2HW(length + P)d per head
        o = o.reshape(B, h, lines, length, d)  # [B, h, lines, length, d]
        o = (o if rows else o.transpose(2, 3)).reshape(B, h, H * W, d)  # [B, h, HW, d]
        if not P:
            return o
        o_prefix = sdpa(q[:, :, :P], k, v, dropout_p=drop)  # [B, h, P, d]: 2PNd per head
        return torch.cat([o_prefix, o], dim=2)  # [B, h, N, d]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        """``shared`` projections: the row pass, then the column pass with the same q, k and the row outputs as
        values (grid tokens score no prefix keys there); prefix tokens keep their row-pass read of all N."""
        B, h, N, d = q.shape
        P, (H, W) = self.num_prefix, grid
        drop = self.attn_drop.p if self.training else 0.0
        o = self.line_attention(q, k, v, grid, rows=True)  # [B, h, N, d]

        def cols(t: Tensor) -> Tensor:
            return t[:, :, P:].reshape(B, h, H, W, d).transpose(2, 3).reshape(B, h * W, H, d)  # [B, h·W, H, d]

        c = sdpa(cols(q), cols(k), cols(o), dropout_p=drop)  # [B, h·W, H, d]: 2HW·H·d per head
        c = c.reshape(B, h, W, H, d).transpose(2, 3).reshape(B, h, H * W, d)  # [B, h, HW, d]
        return torch.cat([o[:, :, :P], c], dim=2)  # [B, h, N, d]

    # ------------------------------------------------------------------------------------ FLOPs

    def flops(self, grid: Optional[Grid] = None) -> int:
        grid = grid or self.grid
        if not self.separate:
            return super().flops(grid)
        H, W = grid
        N, P, C = self.seq_len(grid), self.num_prefix, self.dim
        # row qkv 3NC² + column qkv 3NC² + output projection NC²; row pass: HW queries × (W + P) keys, column pass:
        # HW queries × (H + P) keys, prefix queries × N keys in each pass; q·k and weights·v over d per head
        return 7 * N * C * C + 2 * H * W * (H + W + 2 * P) * C + 4 * P * N * C

    def attend_flops(self, grid: Grid) -> int:
        """``shared``: rows HW × (W + P) keys, columns HW × H keys, prefix P × N keys."""
        H, W = grid
        P, C = self.num_prefix, self.dim
        return 2 * H * W * (H + W + P) * C + 2 * P * self.seq_len(grid) * C

    # ------------------------------------------------------------------------------------ memory

    def memory(self, grid: Optional[Grid] = None, batch: int = 1, amp: Optional[torch.dtype] = None,
               input_dtype: Optional[torch.dtype] = None) -> list[Saved]:
        grid = grid or self.grid
        items = self.projection_memory(self.seq_len(grid), batch, amp)
        if not self.separate:
            return items + self.attend_memory(grid, batch, amp)
        B, h, C, P, N, size = batch, self.num_heads, self.dim, self.num_prefix, self.seq_len(grid), itemsize(amp)
        # the passes' outputs are the inputs of qkv_col and of proj (listed above): one storage each
        items += [Saved("qkv_col input (the row pass's output)", B * N * C, size)]  # [B, N, C]
        if amp is not None:
            items += [Saved("qkv_col weight (autocast copy)", 3 * C * C, size)]  # [3C, C]
        inputs = {"row": "qkv input", "column": "qkv_col input (the row pass's output)"}
        for axis, proj in (("row", "qkv"), ("column", "qkv_col")):  # what each pass's autograd node keeps
            rows, qkv = axis == "row", B * N * 3 * C * size  # [B, N, 3C]
            workspace = self.pass_workspace(grid, batch, amp, rows)
            if self.recomputes(grid, rows):  # the node keeps the input (above) and projects q|k|v again
                items = [i for i in items if i.name != f"{proj} weight (autocast copy)"]
                at = next(n for n, i in enumerate(items) if i.name == inputs[axis])
                # backward holds the q|k|v made again and its gradient beside the pass's workspace
                items[at] = replace(items[at], workspace=2 * qkv + workspace)
            else:
                items.append(Saved(f"{axis} q|k|v ({proj} output)", B * N * 3 * C, size, workspace=workspace))
            items.append(Saved(f"{axis} log-sum-exp", B * h * grid[0] * grid[1], 4))  # [B, h·lines, length] fp32
            if P:
                items.append(Saved(f"{axis} prefix log-sum-exp", B * h * P, 4))  # [B, h, P] fp32
        return items

    def pass_workspace(self, grid: Grid, batch: int, amp: Optional[torch.dtype], rows: bool) -> int:
        """Bytes one pass node's backward allocates beside the q|k|v gradient: one call's group of m lines
        (:func:`vitzoo.ops.axial.lines_per_call`), its output gradient, queries and outputs ``[B, h·m, length, d]``
        and its keys and values ``[B, h·m, P + length, d]`` with the gradients of all three; or, with prefix
        tokens and when larger, the prefix rows' key and value gradients ``[B, h, N, d]``. Under bf16 or fp16 on
        short lines (or a short sequence for the prefix rows) the fp32 copies of the backward kernel's tensors come
        on top (:func:`vitzoo.ops.sdpa.fp32_backward_workspace`).

        Args:
            grid: (H, W); batch: images; amp: autocast dtype or None; rows: the row pass (else the column pass).
        """
        B, C, P, h, d, size = batch, self.dim, self.num_prefix, self.num_heads, self.head_dim, itemsize(amp)
        lines, length = grid if rows else grid[::-1]
        m = min(lines, axial_ops.lines_per_call(C, length, P))
        group = B * m * C * (4 * length + 4 * (P + length)) * size
        group += fp32_backward_workspace(B * h * m, length, P + length, d, amp=amp)  # short lines under amp
        N = self.seq_len(grid)
        prefix = 2 * B * N * C * size + fp32_backward_workspace(B * h, P, N, d, amp=amp) if P else 0
        return max(group, prefix)

    def line_memory(self, grid: Grid, batch: int, amp: Optional[torch.dtype], axis: str) -> list[Saved]:
        """What one pass of :meth:`line_attention` keeps (``shared``'s row pass): its fused SDPA's per-line q, k, v
        (copies: the heads do not merge with the lines in the projection's layout), output and log-sum-exp, and
        with prefix tokens the prefix rows' SDPA, which saves the q|k|v projection output itself.

        Args:
            grid: (H, W); batch: images; amp: autocast dtype or None; axis: ``"row"`` or ``"column"``.
        """
        B, h, d, C, P, size = batch, self.num_heads, self.head_dim, self.dim, self.num_prefix, itemsize(amp)
        H, W = grid
        lines, length = (H, W) if axis == "row" else (W, H)
        kv = B * h * lines * (P + length) * d  # [B, h·lines, P + length, d]: prefix keys in front of the line's
        items = [Saved(f"{axis} k (per line)", kv, size), Saved(f"{axis} v (per line)", kv, size),
                 Saved(f"{axis} output", B * H * W * C, size),  # [B, h·lines, length, d]
                 Saved(f"{axis} log-sum-exp", B * h * H * W, 4)]  # [B, h·lines, length] fp32
        if h > 1 or not P:  # one head and a prefix: the query lines are a view of the projection output (below)
            items.append(Saved(f"{axis} q (per line)", B * H * W * C, size))  # [B, h·lines, length, d]
        if P:  # prefix queries over every token: [B, h, P, d] from q, k, v [B, h, N, d]
            items += [Saved(f"{axis} q|k|v (projection output)", B * (P + H * W) * 3 * C, size),
                      Saved(f"{axis} prefix output", B * P * C, size),  # [B, h, P, d]
                      Saved(f"{axis} prefix log-sum-exp", B * h * P, 4)]  # [B, h, P] fp32
        return items

    def attend_memory(self, grid: Grid, batch: int, amp: Optional[torch.dtype]) -> list[Saved]:
        """``shared``: the row pass (:meth:`line_memory`) and the column SDPA over per-column copies of q, k and
        the row outputs (with one head they are views: of the q|k|v storage, held by the row pass, and of the
        row outputs, ``[B, 1, N, d]``)."""
        B, h, C, size, (H, W) = batch, self.num_heads, self.dim, itemsize(amp), grid
        if h > 1:
            columns = [Saved("column q, k, row output (per column)", 3 * B * H * W * C, size)]  # 3 x [B, h·W, H, d]
        else:
            columns = [Saved("row output (all tokens)", B * self.seq_len(grid) * C, size)]  # [B, 1, N, d]
        return self.line_memory(grid, batch, amp, "row") + columns + [
            Saved("column output", B * H * W * C, size),  # [B, h·W, H, d]
            Saved("column log-sum-exp", B * h * H * W, 4)]  # [B, h·W, H] fp32

    # ------------------------------------------------------------------------------------ reference

    def reference(self, x: Tensor, grid: Grid) -> Tensor:
        """``separate``: two N×N masked softmax attentions (row mask, then column mask, each with the prefix rows
        and columns open), the second on the re-projected output of the first."""
        if not self.separate:
            return super().reference(x, grid)
        B, N, C = x.shape
        row, col = _line_masks(self.num_prefix, grid, x.device)
        open_ = _prefix_open(self.num_prefix, N, x.device)
        o = _masked_softmax_attention(*self.split_heads(x), row | open_, self.scale)  # [B, h, N, d]
        y = o.transpose(1, 2).reshape(B, N, C)  # [B, N, C]
        q, k, v = self.to_heads(self.qkv_col(y), 3)
        o = _masked_softmax_attention(q, k, v, col | open_, self.scale)  # [B, h, N, d]
        return self.merge_heads(o)

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        """``shared``: masked N×N softmax attention twice: the row mask (row + prefix), then the column mask."""
        P, N = self.num_prefix, q.shape[2]
        row, col = _line_masks(P, grid, q.device)
        is_prefix = torch.arange(N, device=q.device) < P
        first = _masked_softmax_attention(q, k, v, row | _prefix_open(P, N, q.device), self.scale)
        second = _masked_softmax_attention(q, k, first, col & ~is_prefix[None, :], self.scale)
        return torch.where(is_prefix[None, None, :, None], first, second)

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        h, w = grid or self.grid
        return {**super().symbols(grid), "H": h, "W": w, "P": self.num_prefix}


def _line_masks(num_prefix: int, grid: Grid, device: torch.device) -> tuple[Tensor, Tensor]:
    """``[N, N]`` boolean masks of grid tokens in the same row, and in the same column (prefix tokens: none)."""
    H, W = grid
    r = torch.full((num_prefix + H * W,), -1, device=device)
    c = torch.full((num_prefix + H * W,), -2, device=device)
    r[num_prefix:] = torch.arange(H * W, device=device) // W
    c[num_prefix:] = torch.arange(H * W, device=device) % W
    grid_token = r >= 0
    same = grid_token[:, None] & grid_token[None, :]
    return same & (r[:, None] == r[None, :]), same & (c[:, None] == c[None, :])


def _prefix_open(num_prefix: int, n: int, device: torch.device) -> Tensor:
    """``[N, N]``: every query may score the prefix keys, and a prefix query every key."""
    is_prefix = torch.arange(n, device=device) < num_prefix
    return is_prefix[None, :] | is_prefix[:, None]


def _masked_softmax_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, scale: float) -> Tensor:
    """``softmax(QKᵀ·scale, where allowed)V`` with explicit exponentials; rows with no allowed key give 0."""
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    e = (s - s.amax(dim=-1, keepdim=True).clamp(min=torch.finfo(s.dtype).min)).exp()
    return torch.einsum("bhij,bhjd->bhid", e / e.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(s.dtype).tiny), v)
