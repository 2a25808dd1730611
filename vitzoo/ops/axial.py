"""One pass of axial attention (:mod:`vitzoo.attention.sparse.axial`, ``projections: separate``) in one autograd
node: the rows or the columns of the token grid, from the fused q|k|v projection output to the merged heads.

Every grid token attends to the tokens of its row (or column) and the P prefix tokens, each prefix token to all N
tokens, through torch's CPU flash attention, one group of lines per call (:func:`lines_per_call`). Backward keeps
only the projection output ``qkv``, the pass's output ``[B, N, C]`` (the next linear layer's input: one storage)
and the log-sum-exp; the per-line copies of q, k and v that the fused kernel reads, and its output in line order,
are made again in backward, one group at a time, so that a call's copies and gradients stay a group's size; under
bf16 or fp16, short lines run the backward kernel on fp32 copies (:func:`vitzoo.ops.sdpa.flash_backward`).
Which path runs a call is ``axial_pass`` in :mod:`vitzoo.ops.dispatch`.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor
from torch.nn import functional as F

from vitzoo.ops.common import slices
from vitzoo.ops.gather import chunk_blocks
from vitzoo.ops.sdpa import flash_backward

Grid = tuple[int, int]


def line_pass(qkv: Tensor, heads: int, grid: Grid, prefix: int, rows: bool, step: Optional[int] = None) -> Tensor:
    """One axial pass through :class:`AxialPass` (same computation as SDPA over per-line copies).

    Args:
        qkv: ``[B, P + H·W, 3C]`` q|k|v projection output, prefix tokens first.
        heads: attention heads h (C = h·d).
        grid: (H, W).
        prefix: prefix tokens P.
        rows: attend along the rows (else along the columns).
        step: lines per fused call (None: :func:`lines_per_call`).

    Returns:
        ``[B, P + H·W, C]``: the heads' outputs side by side.
    """
    step = step or lines_per_call(qkv.shape[-1] // 3, grid[1] if rows else grid[0], prefix)
    return AxialPass.apply(qkv, heads, grid, prefix, rows, step)


def projected_line_pass(x: Tensor, weight: Tensor, bias: Optional[Tensor], heads: int, grid: Grid, prefix: int,
                        rows: bool, step: Optional[int] = None) -> Tensor:
    """:func:`line_pass` of ``F.linear(x, weight, bias)`` through :class:`ProjectedAxialPass`, which keeps ``x``
    in place of the q|k|v projection output and projects it again in backward.

    Args:
        x: ``[B, P + H·W, C]`` the q|k|v projection's input, prefix tokens first.
        weight, bias: the projection's, ``[3C, C]`` and ``[3C]`` (or None).
        heads, grid, prefix, rows, step: as :func:`line_pass`.

    Returns:
        ``[B, P + H·W, C]``: the heads' outputs side by side.
    """
    step = step or lines_per_call(weight.shape[1], grid[1] if rows else grid[0], prefix)
    return ProjectedAxialPass.apply(x, weight, bias, heads, grid, prefix, rows, step)


def lines_per_call(dim: int, length: int, prefix: int) -> int:
    """Lines per fused call: a line's keys (P + length tokens of C channels) count as one gathered block of
    :func:`vitzoo.ops.gather.chunk_blocks`, so a call copies at most that many key elements per image.

    Args:
        dim: channels C; length: tokens per line; prefix: prefix tokens P.
    """
    return chunk_blocks(1, prefix + length, dim)


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


def _flat(t: Tensor, prefix: int, grid: Grid, rows: bool, part: slice) -> Tensor:
    """Lines ``part`` of :func:`_lines` as the fused kernel's batch of lines, ``[B, h·m, length, d]`` (a copy)."""
    lines = _lines(t, prefix, grid, rows)[:, :, part]  # [B, h, m, length, d]
    B, h, m, length, d = lines.shape
    return lines.reshape(B, h * m, length, d)


def _line_keys(t: Tensor, prefix: int, grid: Grid, rows: bool, part: slice) -> Tensor:
    """Keys (or values) of lines ``part``: the P prefix tokens, then the line's, ``[B, h·m, P + length, d]``."""
    line = _flat(t, prefix, grid, rows, part)  # [B, h·m, length, d]
    if not prefix:
        return line
    B, h, _, d = t.shape
    m = line.shape[1] // h
    front = t[:, :, None, :prefix].expand(B, h, m, prefix, d).reshape(B, h * m, prefix, d)
    return torch.cat([front, line], dim=2)  # [B, h·m, P + length, d]


def _pass_forward(qkv: Tensor, heads: int, grid: Grid, P: int, rows: bool,
                  step: int) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    """The pass from ``qkv[B, N, 3C]``: its output ``[B, N, C]``, the lines' log-sum-exp ``[B, h, lines, length]``
    and the prefix rows' ``[B, h, P]`` (None without prefix tokens)."""
    B, N, C3 = qkv.shape
    C = C3 // 3
    q, k, v = _parts(qkv, heads)
    out = qkv.new_empty(B, N, C)  # [B, N, C]: heads side by side, the next projection's input
    o = out.view(B, N, heads, C // heads).transpose(1, 2)  # [B, h, N, d]: a view of out
    o_lines = _lines(o, P, grid, rows)  # [B, h, lines, length, d]: a view of out
    lse = qkv.new_empty(B, heads, *o_lines.shape[2:4], dtype=torch.promote_types(qkv.dtype, torch.float32))
    # lse: [B, h, lines, length], fp32 (fp64 for fp64 inputs) as the kernel writes it
    for part in slices(o_lines.shape[2], step):
        q_l = _flat(q, P, grid, rows, part)  # [B, h·m, length, d]
        o_l, lse_l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q_l, _line_keys(k, P, grid, rows, part), _line_keys(v, P, grid, rows, part), 0.0, False)
        o_l = o_l + q_l.sum(dim=-1, keepdim=True) * 0  # a non-finite query: a non-finite row (as sdpa)
        o_lines[:, :, part].copy_(o_l.view(o_lines[:, :, part].shape))
        lse[:, :, part].copy_(lse_l.view(lse[:, :, part].shape))
    lse_p = None
    if P:  # prefix queries over every token: [B, h, P, d]
        o_p, lse_p = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q[:, :, :P], k, v, 0.0, False)
        o[:, :, :P] = o_p + q[:, :, :P].sum(dim=-1, keepdim=True) * 0
    return out, lse, lse_p


def _pass_backward(qkv: Tensor, out: Tensor, lse: Tensor, lse_p: Optional[Tensor], grad: Tensor, heads: int,
                   grid: Grid, P: int, rows: bool, step: int) -> Tensor:
    """The gradient ``[B, N, 3C]`` of the pass's ``qkv`` from its output's ``grad[B, N, C]``."""
    B, N, C = out.shape
    d = C // heads
    q, k, v = _parts(qkv, heads)
    o = out.view(B, N, heads, d).transpose(1, 2)  # [B, h, N, d]
    g = grad.reshape(B, N, heads, d).transpose(1, 2)  # [B, h, N, d]
    d_qkv = torch.zeros_like(qkv)  # [B, N, 3C]
    d_q, d_k, d_v = _parts(d_qkv, heads)
    for part in slices(lse.shape[2], step):
        m = part.stop - part.start
        dq_l, dk_l, dv_l = flash_backward(
            _flat(g, P, grid, rows, part), _flat(q, P, grid, rows, part), _line_keys(k, P, grid, rows, part),
            _line_keys(v, P, grid, rows, part), _flat(o, P, grid, rows, part),
            lse[:, :, part].reshape(B, heads * m, -1))
        lines = _lines(d_q, P, grid, rows)[:, :, part]  # [B, h, m, length, d]
        lines.copy_(dq_l.view(lines.shape))
        for dst, src in ((d_k, dk_l), (d_v, dv_l)):
            src = src.view(B, heads, m, src.shape[2], d)  # [B, h, m, P + length, d]
            _lines(dst, P, grid, rows)[:, :, part].copy_(src[:, :, :, P:])
            if P:  # the prefix keys of every line
                dst[:, :, :P] += src[:, :, :, :P].sum(dim=2)
    if P:
        dq_p, dk_p, dv_p = flash_backward(g[:, :, :P].contiguous(), q[:, :, :P], k, v, o[:, :, :P].contiguous(), lse_p)
        d_q[:, :, :P] = dq_p
        d_k.add_(dk_p)
        d_v.add_(dv_p)
    return d_qkv


class AxialPass(torch.autograd.Function):
    """:func:`line_pass`: forward and backward through ``aten._scaled_dot_product_flash_attention_for_cpu``
    (and its backward), a group of lines per call, saving ``qkv``, the output and the log-sum-exp of the lines
    and of the prefix rows."""

    @staticmethod
    def forward(ctx: Any, qkv: Tensor, heads: int, grid: Grid, prefix: int, rows: bool, step: int) -> Tensor:
        out, lse, lse_p = _pass_forward(qkv, heads, grid, prefix, rows, step)
        ctx.args = heads, grid, prefix, rows, step
        ctx.save_for_backward(qkv, out, lse, lse_p)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
        qkv, out, lse, lse_p = ctx.saved_tensors
        return _pass_backward(qkv, out, lse, lse_p, grad, *ctx.args), None, None, None, None, None


def _autocast(t: Optional[Tensor]) -> Optional[Tensor]:
    """``t`` in the CPU autocast dtype where autocast is on (as a linear layer reads it), else ``t``."""
    if t is None or not torch.is_autocast_enabled("cpu"):
        return t
    return t.to(torch.get_autocast_dtype("cpu"))


class ProjectedAxialPass(torch.autograd.Function):
    """:func:`projected_line_pass`: the pass from the projection's input, keeping for backward that input (its
    autocast copy under autocast), the pass's output and the log-sum-exp; backward projects the q|k|v again."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Optional[Tensor], heads: int, grid: Grid, prefix: int,
                rows: bool, step: int) -> Tensor:
        x_in = _autocast(x)  # [B, N, C]
        out, lse, lse_p = _pass_forward(F.linear(x_in, _autocast(weight), _autocast(bias)), heads, grid, prefix,
                                        rows, step)
        ctx.args = heads, grid, prefix, rows, step
        ctx.save_for_backward(x_in, weight, bias, out, lse, lse_p)
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
        x_in, weight, bias, out, lse, lse_p = ctx.saved_tensors
        w = _autocast(weight)  # [3C, C]
        qkv = F.linear(x_in, w, _autocast(bias))  # [B, N, 3C], as in forward
        d_qkv = _pass_backward(qkv, out, lse, lse_p, grad, *ctx.args)
        del qkv
        d_x = d_qkv @ w  # [B, N, C]
        d_w = (d_qkv.flatten(0, 1).t() @ x_in.flatten(0, 1)).to(weight.dtype)  # [3C, C]
        d_b = d_qkv.sum((0, 1)).to(bias.dtype) if bias is not None else None
        return d_x, d_w, d_b, None, None, None, None, None
