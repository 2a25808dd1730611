"""Activation memory of the fixed sparse patterns (:meth:`SparsePatternAttention.attend` on the CPU's blocked path).

:func:`pattern_memory` lists what one training forward of the pattern keeps for backward, each storage once
(:class:`vitzoo.costs.Saved`), following the same choices the forward makes: the block path that
:mod:`vitzoo.ops.dispatch` picks (``autograd_function`` keeps the blocks' log-sum-exp, ``checkpoint`` under
autocast only its inputs, with one chunk's recomputation declared as the backward's workspace), halo groups with a
relative position bias (:func:`vitzoo.ops.halo.halo_scores`: its autograd Function keeps a log-sum-exp), dense and
gathered head groups, global rows and learned tokens. Attention dropout is taken as 0 (the default): with dropout
the fused kernels do not run.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

import torch

from vitzoo.attention.base import Grid
from vitzoo.attention.sparse.halo import HaloGroup
from vitzoo.costs import Saved, itemsize
from vitzoo.ops import dispatch
from vitzoo.ops.gather import FORWARD_SCALE, chunk_blocks


class Kept:
    """Saved storages by name: a storage that several ops save is listed once."""

    def __init__(self) -> None:
        self.items: dict[str, Saved] = {}

    def add(self, name: str, numel: int, size: int) -> None:
        """Keep ``numel`` elements of ``size`` bytes under ``name`` unless a storage of that name is kept already."""
        if numel and name not in self.items:
            self.items[name] = Saved(name, numel, size)

    def add_workspace(self, name: str, nbytes: int) -> None:
        """Declare ``nbytes`` of workspace on the kept entry ``name`` (the largest declaration stays)."""
        item = self.items[name]
        self.items[name] = replace(item, workspace=max(item.workspace, nbytes))

    def list(self) -> list[Saved]:
        return list(self.items.values())


def recompute_workspace(batch: int, heads: int, length: int, head_dim: int, blocks: int, keys: int, itemsize: int,
                        per_head: bool) -> int:
    """Bytes one chunk of a checkpointed :func:`~vitzoo.ops.gather.block_attention` call allocates while backward
    recomputes it: its gathered keys and values ``[B, c·m, K, d]`` each (global ones included), the gather before
    the join and the gradients of both; with per-head ids (``per_head``) also the contiguous copies of ``k`` and ``v``
    ``[B, c, L, d]`` that the gather reads rows from, and their gradients.

    Args:
        batch, heads, length, head_dim: B, c, L and d of ``k``.
        blocks, keys: n query blocks of the call and the keys of each (G + K).
        itemsize: bytes per element.
        per_head: the key ids are per head (``[c, n, K]``).
    """
    m = min(blocks, chunk_blocks(heads, keys, head_dim, FORWARD_SCALE))  # one chunk's blocks
    gathered = 2 * 2 * batch * heads * m * keys * head_dim  # k, v: gathered and joined
    rows = 2 * 2 * batch * heads * length * head_dim if per_head else 0  # k, v copies and their gradients
    return (2 * gathered + rows) * itemsize  # the gathered tensors and their gradients


def block_path(amp: Optional[torch.dtype], p_drop: float = 0.0) -> str:
    """The implementation :mod:`vitzoo.ops.dispatch` picks for a training call of ``block_attention`` on the CPU
    with fp32 inputs under autocast ``amp`` (``"autograd_function"`` or ``"checkpoint"``)."""
    t = torch.empty(0, dtype=amp or torch.float32, requires_grad=True)  # q, k, v as the call passes them
    with torch.enable_grad(), torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
        return dispatch.select("block_attention", t, t, t, None, None, p_drop)


def pattern_memory(attn: Any, grid: Grid, batch: int, amp: Optional[torch.dtype]) -> list[Saved]:
    """What :meth:`~vitzoo.attention.sparse.pattern.SparsePatternAttention.attend` keeps for backward on the CPU
    (the q/k/v projections' output storages included, their inputs not).

    Args:
        attn: a :class:`~vitzoo.attention.sparse.pattern.SparsePatternAttention`.
        grid: (H, W); batch: images; amp: autocast dtype or None.
    """
    dispatch.select("sparse_pattern", attn.cfg.impl, "cpu", True, 0.0, True)  # impl=flex: its ConfigError
    pat = attn.pattern_at(grid)
    B, h, d, C, P, g = batch, attn.num_heads, attn.head_dim, attn.dim, attn.num_prefix, attn.num_learned
    L, size, glob_proj = grid[0] * grid[1], itemsize(amp), attn.qkv_global is not None
    N, Gg = P + L, pat.num_global_grid
    G = P + g + Gg  # keys every grid query sees in front of its own
    kept = Kept()
    # the storages q, k, v are views of: one fused output, or q apart from k|v (separate_q, qkv_global)
    q_name, k_name = ("q|k|v (projection output)", "q|k|v (projection output)")
    q_numel, k_numel = B * N * 3 * C, B * N * 3 * C  # [B, N, 3C]
    if attn.separate_q or glob_proj:
        q_name, k_name, q_numel, k_numel = "q (projection output)", "k|v (projection output)", B * N * C, B * N * 2 * C
    kg_name = "global rows' k|v (qkv_global output)"  # [B, N, 2C]
    if g:  # learned tokens read every token (k, v of qkv or qkv_global), their states give keys and values
        kept.add("learned queries", g * C, size)  # [g, C]
        kept.add(*((kg_name, B * N * 2 * C) if glob_proj else (k_name, k_numel)), size)
        kept.add("learned read output", B * g * C, size)  # [B, h, g, d]
        kept.add("learned read log-sum-exp", B * h * g, 4)  # [B, h, g] fp32
        if amp is None:
            kept.add("learned states", B * g * C, 4)  # [B, g, C]: input of their k|v projection
        else:  # the queries' weight rows, the tokens, the k|v weight rows and the states: autocast copies
            kept.add("learned query weight rows (autocast copy)", C * C, size)  # [C, C]
            kept.add("learned tokens (autocast copy)", g * C, size)  # [g, C]
            # the states' k|v through qkv and, with qkv_global and prefix rows, through qkv_global: a cast each
            for proj in ("qkv", "qkv_global")[:2 if glob_proj and P else 1]:
                kept.add(f"states' {proj} k|v weight rows (autocast copy)", 2 * C * C, size)  # [2C, C]
                kept.add(f"learned states for {proj} (autocast copy)", B * g * C, size)  # [B, g, C]
    rows = P + Gg  # global query rows
    every = f"every key's {{}} (prefix, learned, grid: [B, h, {P + g} + L, d])"
    # k_all, v_all of the dense, gathered and global rows: k, v themselves without learned tokens
    k_all = [(every.format(t), B * (P + g + L) * C) for t in "kv"] if g else [(k_name, k_numel)]
    if rows:  # global queries over every key: [B, h, P + G_grid, d]
        if Gg:
            kept.add("global rows' q (prefix and global-grid queries)", B * rows * C, size)  # [B, h, P + G_grid, d]
        else:
            kept.add(q_name, q_numel, size)
        if glob_proj:
            for name, numel in ([(f"global rows' {every.format(t)}", B * (P + g + L) * C) for t in "kv"] if g
                                else [(kg_name, B * N * 2 * C)]):
                kept.add(name, numel, size)
        else:
            for name, numel in k_all:
                kept.add(name, numel, size)
        kept.add("global rows' output", B * rows * C, size)  # [B, h, P + G_grid, d]
        kept.add("global rows' log-sum-exp", B * h * rows, 4)  # [B, h, P + G_grid] fp32
    path = block_path(amp, 0.0)
    for index, group in enumerate(pat.groups):
        c = group.heads
        if isinstance(group, HaloGroup):
            nb, S, K = group.mask.shape
            with torch.no_grad():  # the forward writes the scores out where the group has a bias
                biased = attn.halo_bias(group, slice(0, c)) is not None
            if biased:
                halo_scores_memory(kept, ((q_name, q_numel), (k_name, k_numel)), group, (B, h, c, d), G, index, amp)
                continue
            kept.add(q_name, q_numel, size)
            kept.add(k_name, k_numel, size)
            if G:
                kept.add("global keys", B * h * G * d, size)  # [B, h, G, d]
                kept.add("global values", B * h * G * d, size)
                kept.add(f"group {index} mask with global keys", nb * S * (G + K), 1)  # [blocks, S, G + K] bool
            if path == "autograd_function":
                kept.add(f"group {index} block log-sum-exp", B * c * nb * S, 4)  # [B, c, blocks, S] fp32
        else:
            kept.add(q_name, q_numel, size)
            for name, numel in k_all:
                kept.add(name, numel, size)
            if group.keys is None:  # dense heads: SDPA of every grid query
                kept.add(f"group {index} output", B * L * c * d, size)  # [B, c, L, d]
                kept.add(f"group {index} log-sum-exp", B * c * L, 4)  # [B, c, L] fp32
            elif path == "autograd_function":  # gathered blocks: [B, c, Q, S] fp32
                kept.add(f"group {index} block log-sum-exp", B * c * pat.queries.numel(), 4)
            else:  # checkpointed chunks: one chunk's gathered keys and values are recomputed at a time
                n, keys = group.keys.shape[-2:]  # [(c,) n, K]
                ws = recompute_workspace(B, c, P + g + L, d, n, keys, size, group.keys.dim() == 3)
                kept.add_workspace(q_name, ws)
    return kept.list()


def halo_scores_memory(kept: Kept, names: tuple[tuple[str, int], tuple[str, int]], group: HaloGroup,
                       dims: tuple[int, int, int, int], G: int, index: int, amp: Optional[torch.dtype]) -> None:
    """What :func:`vitzoo.ops.halo.halo_scores` keeps for a group of c heads in training without dropout (its
    autograd Function): q, k, v (views of the projection outputs), the global keys/values and the log-sum-exp of
    each query slot (fp32: the scores are in the bias' precision); the bias table, its indices, the mask and the
    ids are the module's own.

    Args:
        kept: the storages so far; names: (name, elements) of q's and of k|v's projection output storage;
        group: the halo group; dims: (B, h, c, d), images, all heads, the group's heads, head width; G: global
        keys; index: the group's place; amp: autocast dtype or None.
    """
    (B, h, c, d), (nb, S, _), size = dims, group.mask.shape, itemsize(amp)
    for name, numel in names:
        kept.add(name, numel, size)
    if G:  # every group's heads are views of one storage
        kept.add("global keys", B * h * G * d, size)  # [B, h, G, d]
        kept.add("global values", B * h * G * d, size)
    kept.add(f"group {index} halo log-sum-exp", B * c * nb * S, 4)  # [B, c, blocks, S] fp32
