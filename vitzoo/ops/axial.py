"""One pass of axial attention (:mod:`vitzoo.attention.sparse.axial`, ``projections: separate``) in one autograd
node: the rows or the columns of the token grid, from the fused q|k|v projection output to the merged heads.

Every grid token attends to the tokens of its row (or column) and the P prefix tokens, each prefix token to all N
tokens, through torch's CPU flash attention. Backward keeps only the projection output ``qkv``, the pass's output
``[B, N, C]`` (the next linear layer's input: one storage) and the log-sum-exp; the per-line copies of q, k and v
that the fused kernel reads, and its output in line order, are made again in backward. Which path runs a call is
``axial_pass`` in :mod:`vitzoo.ops.dispatch`.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

Grid = tuple[int, int]


def line_pass(qkv: Tensor, heads: int, grid: Grid, prefix: int, rows: bool) -> Tensor:
    """One axial pass through :class:`AxialPass` (same computation as SDPA over per-line copies).

    Args:
        qkv: ``[B, P + H·W, 3C]`` q|k|v projection output, prefix tokens first.
        heads: attention heads h (C = h·d).
        grid: (H, W).
        prefix: prefix tokens P.
        rows: attend along the rows (else along the columns).

    Returns:
        ``[B, P + H·W, C]``: the heads' outputs side by side.
    """
    return AxialPass.apply(qkv, heads, grid, prefix, rows)


def _parts(qkv: Tensor, heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """``qkv[B, N, 3C]`` -> q, k, v views ``[B, h, N, d]``."""
    B, N, C3 = qkv.shape
    t = qkv.view(B, N, 3, heads, C3 // (3 * heads))  # [B, N, 3, h, d]
    return tuple(p.transpose(1, 2) for p in t.unbind(2))


def _lines(t: Tensor, prefix: int, grid: Grid, rows: bool) -> Tensor:
    """The grid tokens of ``t[B, h, P + H·W, d]`` by line, a view ``[B, h, lines, length, d]``."""
    B, h, _, d = t.shape
    H, W = grid
    t = t[:, :, prefix:].view(B, h, H, W, d)  # [B, h, H, W, d]
    return t if rows else t.transpose(2, 3)  # [B, h, W, H, d] for the columns


def _flat(t: Tensor, prefix: int, grid: Grid, rows: bool) -> Tensor:
    """:func:`_lines` as the fused kernel's batch of lines, ``[B, h·lines, length, d]`` (a copy)."""
    B, h, lines, length, d = _lines(t, prefix, grid, rows).shape
    return _lines(t, prefix, grid, rows).reshape(B, h * lines, length, d)


def _line_keys(t: Tensor, prefix: int, grid: Grid, rows: bool) -> Tensor:
    """Keys (or values) of every line: the P prefix tokens, then the line's, ``[B, h·lines, P + length, d]``."""
    line = _flat(t, prefix, grid, rows)  # [B, h·lines, length, d]
    if not prefix:
        return line
    B, h, _, d = t.shape
    lines = line.shape[1] // h
    front = t[:, :, None, :prefix].expand(B, h, lines, prefix, d).reshape(B, h * lines, prefix, d)
    return torch.cat([front, line], dim=2)  # [B, h·lines, P + length, d]


class AxialPass(torch.autograd.Function):
    """:func:`line_pass`: forward and backward through ``aten._scaled_dot_product_flash_attention_for_cpu``
    (and its backward), saving ``qkv``, the output and the log-sum-exp of the lines and of the prefix rows."""

    @staticmethod
    def forward(ctx: Any, qkv: Tensor, heads: int, grid: Grid, prefix: int, rows: bool) -> Tensor:
        B, N, C3 = qkv.shape
        C, P = C3 // 3, prefix
        q, k, v = _parts(qkv, heads)
        q_l = _flat(q, P, grid, rows)  # [B, h·lines, length, d]
        o_l, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q_l, _line_keys(k, P, grid, rows), _line_keys(v, P, grid, rows), 0.0, False)
        o_l = o_l + q_l.sum(dim=-1, keepdim=True) * 0  # a non-finite query: a non-finite row (as sdpa)
        out = qkv.new_empty(B, N, C)  # [B, N, C]: heads side by side, the next projection's input
        o = out.view(B, N, heads, C // heads).transpose(1, 2)  # [B, h, N, d]: a view of out
        _lines(o, P, grid, rows).copy_(o_l.view(_lines(o, P, grid, rows).shape))
        lse_p = None
        if P:  # prefix queries over every token: [B, h, P, d]
            o_p, lse_p = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q[:, :, :P], k, v, 0.0, False)
            o[:, :, :P] = o_p + q[:, :, :P].sum(dim=-1, keepdim=True) * 0
        ctx.heads, ctx.grid, ctx.prefix, ctx.rows = heads, grid, P, rows
        ctx.save_for_backward(qkv, out, lse, lse_p)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
        qkv, out, lse, lse_p = ctx.saved_tensors
        heads, grid, P, rows = ctx.heads, ctx.grid, ctx.prefix, ctx.rows
        B, N, C = out.shape
        d = C // heads
        q, k, v = _parts(qkv, heads)
        o = out.view(B, N, heads, d).transpose(1, 2)  # [B, h, N, d]
        g = grad.reshape(B, N, heads, d).transpose(1, 2)  # [B, h, N, d]
        d_qkv = torch.zeros_like(qkv)  # [B, N, 3C]
        d_q, d_k, d_v = _parts(d_qkv, heads)
        dq_l, dk_l, dv_l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            _flat(g, P, grid, rows), _flat(q, P, grid, rows), _line_keys(k, P, grid, rows),
            _line_keys(v, P, grid, rows), _flat(o, P, grid, rows), lse, 0.0, False)
        lines = _lines(d_q, P, grid, rows)
        lines.copy_(dq_l.view(lines.shape))
        for dst, src in ((d_k, dk_l), (d_v, dv_l)):
            src = src.view(B, heads, -1, src.shape[2], d)  # [B, h, lines, P + length, d]
            _lines(dst, P, grid, rows).copy_(src[:, :, :, P:])
            if P:  # the prefix keys of every line
                dst[:, :, :P] = src[:, :, :, :P].sum(dim=2)
        if P:
            dq_p, dk_p, dv_p = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                g[:, :, :P].contiguous(), q[:, :, :P], k, v, o[:, :, :P].contiguous(), lse_p, 0.0, False)
            d_q[:, :, :P] = dq_p
            d_k.add_(dk_p)
            d_v.add_(dv_p)
        return d_qkv, None, None, None, None
