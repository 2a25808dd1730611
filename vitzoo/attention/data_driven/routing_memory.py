"""Activation memory of ``routing``: what one training forward keeps for backward, by part.

Every op runs in the q/k/v projection's dtype under autocast; indices are int64 and masks bool. The clusters decide
which tokens meet, the span S (key blocks per query block of the routing heads) decides the sizes: the caller passes
the S of the forward it describes (``assignment: balanced`` runs every head through pieces of w tokens: no span).
A batched matmul over a head group copies its prefix keys and values, unless the batch or the group has one entry
(then it views the q|k|v storage, kept anyway).
"""
from __future__ import annotations

from typing import Optional

import torch

from vitzoo.costs import Saved, itemsize


def prefix_part_memory(B: int, h: int, M: int, P: int, d: int, size: int) -> list[Saved]:
    """What :func:`~vitzoo.attention.data_driven.bucket.prefix_part` keeps for ``h`` heads (nothing where P is 0).

    Args:
        B: images; h: heads of the group; M: grid queries; P: prefix keys; d: head width; size: bytes per element.
    """
    if not P:
        return []
    items = [Saved("grid queries (scaled)", B * h * M * d, size),  # [B, h, M, d]: vs the prefix keys
             Saved("prefix-key scores", B * h * M * P, size),  # [B, h, M, P]: logsumexp input
             Saved("prefix-key weights", B * h * M * P, size),  # [B, h, M, P]
             Saved("prefix-key log-sum-exp", B * h * M, size)]  # [B, h, M]
    if B > 1 and h > 1:
        items += [Saved("prefix keys (matmul copy)", B * h * d * P, size),  # [B·h, d, P]
                  Saved("prefix values (matmul copy)", B * h * P * d, size)]  # [B·h, P, d]
    return items


def scatter_combine_memory(B: int, h: int, slots: int, M: int, d: int, size: int, extra: bool,
                           extra_output: bool) -> list[Saved]:
    """What :func:`~vitzoo.attention.data_driven.bucket.scatter_combine` keeps for ``h`` heads.

    Args:
        B: images; h: heads; slots: query slots of all pieces (K·w); M: tokens; d: head width; size: bytes per
            element; extra: a part every token has is merged; extra_output: that part's output is a new tensor
            (False: a view of the q|k|v storage).
    """
    items = [Saved("piece weights", B * h * slots, size),  # [B, h, K·w]: exp of the shifted lse
             Saved("piece outputs", B * h * slots * d, size)]  # [B, h, K·w, d]
    if extra:
        items.append(Saved("extra-part weights", B * h * M, size))  # [B, h, M]
        if extra_output:
            items.append(Saved("extra-part outputs", B * h * M * d, size))  # [B, h, M, d]
    return items + [Saved("token normaliser", B * h * M, size),  # [B, h, M]: clamp_min input
                    Saved("token normaliser (clamped)", B * h * M, size),  # [B, h, M, 1]: divisor
                    Saved("token numerator", B * h * M * d, size)]  # [B, h, M, d]


def pieces_memory(B: int, h: int, K: int, w: int, M: int, P: int, d: int, size: int) -> list[Saved]:
    """``h`` heads through K pieces of w queries and w keys each (local windows, balanced clusters), the prefix
    keys as a part every token has, merged back to the M tokens (the pieces' token indices are the caller's).

    Args:
        B: images; h: heads; K: pieces; w: piece size; M: grid tokens; P: prefix tokens; d: head width;
        size: bytes per element.
    """
    items = [Saved("k|v grid tokens", B * h * M * 2 * d, size),  # [B, h, M, 2d]: gather input
             Saved("piece keys|values", B * h * K * w * 2 * d, size),  # [B, h, K, w, 2d]
             Saved("piece queries (scaled)", B * h * K * w * d, size),  # [B, h, K, w, d]
             Saved("piece scores", B * h * K * w * w, size),  # [B, h, K, w, w]: logsumexp input
             Saved("piece weights (softmax)", B * h * K * w * w, size),  # [B, h, K, w, w]
             Saved("piece log-sum-exp", B * h * K * w, size)]  # [B, h, K, w]
    items += prefix_part_memory(B, h, M, P, d, size)
    return items + scatter_combine_memory(B, h, K * w, M, d, size, extra=P > 0, extra_output=True)


def routing_memory(attn, grid: tuple[int, int], batch: int, amp: Optional[torch.dtype], span: int) -> list[Saved]:
    """:meth:`RoutingAttention.attend_memory` with the span given (the q|k|v storage, local and routing heads, the
    prefix rows); ``assignment: balanced`` runs every head through pieces and has no span.

    Args:
        attn: the :class:`~vitzoo.attention.data_driven.routing.RoutingAttention`.
        grid: token grid; batch: images; amp: autocast dtype or ``None``; span: S of the forward described.
    """
    B, h, d, C, size = batch, attn.num_heads, attn.head_dim, attn.dim, itemsize(amp)
    N, M, P, K = attn.seq_len(grid), grid[0] * grid[1], attn.num_prefix, attn.num_clusters
    w, hl = attn.cluster_size(grid), attn.local_heads
    hr, nb = h - hl, -(-M // w)
    items = [Saved("q|k|v (projection output)", B * N * 3 * C, size)]  # [B, N, 3C]: the query gathers' input
    if attn.cfg.assignment == "balanced":  # windows and top-w clusters side by side, as token indices
        items += [Saved("query piece tokens", B * h * K * w, 8),  # [B, h, K, w] int64: gather and scatter index
                  Saved("key piece tokens", B * h * K * w, 8)]  # [B, h, K, w] int64: gather index
        return items + pieces_memory(B, h, K, w, M, P, d, size) + prefix_rows_memory(B, h, N, P, d, size)
    items.append(Saved("window tokens", K * w, 8))  # [K, w] int64: the local heads' index (expanded)
    items += pieces_memory(B, hl, K, w, M, P, d, size)
    if hr:  # routing heads: nb blocks of w sorted queries against S·w sorted keys
        items += [Saved("key slot tokens", B * hr * nb * span * w, 8),  # [B, h_r, nb, S·w] int64
                  Saved("routing k|v grid tokens", B * hr * M * 2 * d, size),  # [B, h_r, M, 2d]: gather input
                  Saved("query slot tokens", B * hr * nb * w, 8),  # [B, h_r, nb, w] int64
                  Saved("block keys|values", B * hr * nb * span * w * 2 * d, size),  # [B, h_r, nb, S·w, 2d]
                  Saved("block queries (scaled)", B * hr * nb * w * d, size),  # [B, h_r, nb, w, d]
                  Saved("block scores", B * hr * nb * w * span * w, size),  # [B, h_r, nb, w, S·w]
                  Saved("block weights", B * hr * nb * w * span * w, size),  # [B, h_r, nb, w, S·w]
                  Saved("block log-sum-exp", B * hr * nb * w, size),  # [B, h_r, nb, w]
                  Saved("repeated-slot mask", nb * w, 1),  # [nb, w] bool
                  Saved("own-key queries (scaled)", B * hr * M * d, size),  # [B·h_r·M, 1, d]
                  Saved("keyless-cluster mask", B * hr * M, 1)]  # [B, h_r, M] bool
        if not (hr == 1 and (B == 1 or P == 0)):  # else the own-key matmul views k in the q|k|v storage
            items.append(Saved("own keys (matmul copy)", B * hr * M * d, size))  # [B·h_r·M, d, 1]
        items += prefix_part_memory(B, hr, M, P, d, size)
        if P:  # the prefix part and the own-key part merged first
            items += [Saved("prefix|own weights", B * hr * 2 * M, size),  # [B, h_r, 2, M]
                      Saved("prefix|own outputs", B * hr * 2 * M * d, size),  # [B, h_r, 2, M, d]
                      Saved("prefix|own log-normalisers", B * hr * 2 * M, size),  # [B, h_r, 2, M]: logsumexp input
                      Saved("prefix|own log-sum-exp", B * hr * M, size)]  # [B, h_r, M]
        items += scatter_combine_memory(B, hr, nb * w, M, d, size, extra=True, extra_output=P > 0)
    return items + prefix_rows_memory(B, h, N, P, d, size)


def prefix_rows_memory(B: int, h: int, N: int, P: int, d: int, size: int) -> list[Saved]:
    """Prefix queries attending to all N keys (``BucketAttention.prefix_rows``).

    Args:
        B: images; h: heads; N: tokens; P: prefix tokens; d: head width; size: bytes per element.
    """
    if not P:
        return []
    items = [Saved("prefix queries (scaled)", B * h * P * d, size),  # [B, h, P, d]
             Saved("prefix-query weights", B * h * P * N, size)]  # [B, h, P, N]
    if B > 1 and h > 1:  # else the matmuls view k and v in the q|k|v storage
        items += [Saved("keys (matmul copy)", B * h * d * N, size),  # [B·h, d, N]
                  Saved("values (matmul copy)", B * h * N * d, size)]  # [B·h, N, d]
    return items
