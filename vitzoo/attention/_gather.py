"""Gathered key lists: the kernels of BigBird's block groups (:mod:`vitzoo.attention.bigbird`).

Paper: Zaheer et al., "Big Bird: Transformers for Longer Sequences", NeurIPS 2020,
https://arxiv.org/abs/2007.14062 (block-sparse attention over gathered key blocks).

Grid queries come in Q groups of S tokens that share one list of K key tokens; keys and values are
gathered with ``index_select`` and scored by a batched matmul, ``[B, h, Q, S, G + K]``, plus G
global keys every query sees. Used through :class:`vitzoo.attention._sparse.SparsePatternAttention`.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitzoo.attention.base import Grid


def gather_tokens(x: Tensor, index: Tensor) -> Tensor:
    """``x[B, h, L, d]`` gathered along tokens by ``index[Q, K]`` -> ``[B, h, Q, K, d]``."""
    B, h, _, d = x.shape
    return x.index_select(2, index.flatten()).view(B, h, *index.shape, d)  # [B, h, Q·K, d] -> [B, h, Q, K, d]


def pad_grid(x: Tensor, grid: Grid, padded: Grid) -> Tensor:
    """``x[B, h, H·W, d]`` zero-padded at the bottom/right to ``[B, h, H'·W', d]``."""
    if tuple(padded) == tuple(grid):
        return x
    (H, W), (Hp, Wp) = grid, padded
    B, h, _, d = x.shape
    x = F.pad(x.reshape(B, h, H, W, d), (0, 0, 0, Wp - W, 0, Hp - H))  # [B, h, H', W', d]
    return x.reshape(B, h, Hp * Wp, d)  # [B, h, L', d]


def gathered_attention(q: Tensor, k: Tensor, v: Tensor, keys: Tensor, valid: Optional[Tensor],
                       k_glob: Tensor, v_glob: Tensor, scale: float, drop: nn.Module) -> Tensor:
    """Softmax attention of query groups over their gathered keys plus the global keys.

    Args:
        q: ``[B, h, Q, S, d]`` queries in Q groups of S.
        k, v: ``[B, h, L', d]`` grid keys/values (padded grid).
        keys: ``[Q, K]`` ids into ``k``/``v`` of each group's keys.
        valid: ``[Q, K]`` booleans or None.
        k_glob, v_glob: ``[B, h, G, d]`` keys/values every query attends to (G may be 0).
        scale: 1/√d.
        drop: dropout on the attention weights.

    Returns:
        ``[B, h, Q, S, d]``.
    """
    B, h, Q, S, d = q.shape
    K, G = keys.shape[1], k_glob.shape[2]
    k_loc, v_loc = gather_tokens(k, keys), gather_tokens(v, keys)  # [B, h, Q, K, d]
    scores = (q @ k_loc.transpose(-1, -2)) * scale  # [B, h, Q, S, K]
    if valid is not None:
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))  # valid [Q, 1, K]
    if G:
        q_flat = q.reshape(B, h, Q * S, d)  # [B, h, Q·S, d]
        scores_glob = (q_flat @ k_glob.transpose(-1, -2)) * scale  # [B, h, Q·S, G]
        scores = torch.cat([scores_glob.view(B, h, Q, S, G), scores], dim=-1)  # [B, h, Q, S, G + K]
    attn = drop(scores.softmax(dim=-1))
    attn_glob, attn_loc = attn.split([G, K], dim=-1)
    out = attn_loc @ v_loc  # [B, h, Q, S, d]
    if G:
        out = out + (attn_glob.reshape(B, h, Q * S, G) @ v_glob).view(B, h, Q, S, d)  # [B, h, Q·S, d] -> groups
    return out
