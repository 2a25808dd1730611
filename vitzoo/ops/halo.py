"""Blocked (halo) neighbourhood attention: each query block over its halo of keys plus the global keys.

The blocks, halos and masks come from the backend (:class:`vitzoo.attention.sparse.halo.HaloGroup`, built from
the pattern's geometry); here they run through :func:`vitzoo.ops.gather.block_attention` (the compiled CPU
kernel or fused SDPA, as :mod:`vitzoo.ops.dispatch` picks), or, with an additive bias that needs a gradient
(NAT's relative positions), with the scores written out (:func:`halo_scores`).
"""
from __future__ import annotations

from typing import Optional, Protocol

import torch
from torch import Tensor, nn

from vitzoo.ops.gather import block_attention, global_mask


class HaloBlocks(Protocol):
    """What the halo path reads of a head group: ``mask[blocks, S, K]`` (a halo slot is a key of a query slot),
    ``q_ids[blocks·S]``, ``k_ids[blocks·K]`` raster ids and ``out_ids[H·W]`` (the slot holding each output)."""

    mask: Tensor
    q_ids: Tensor
    k_ids: Tensor
    out_ids: Tensor


def halo_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    group: HaloBlocks,
    k_glob: Tensor,
    v_glob: Tensor,
    scale: float,
    drop: Optional[nn.Module] = None,
    bias: Optional[Tensor] = None,
) -> Tensor:
    """Softmax attention of each query block over its halo (masked to each query's keys) plus the global keys.

    Without a bias the blocks run as fused SDPA calls that backward recomputes
    (:func:`~vitzoo.ops.gather.block_attention`: the cut keys/values and the probabilities
    are not stored). With a bias (NAT's relative positions, which need a gradient) the scores are
    written out (:func:`halo_scores`).

    Args:
        q, k, v: ``[B, h, H·W, d]`` grid queries, keys and values (raster order).
        group: the head group's blocks (:class:`~vitzoo.attention.sparse.halo.HaloGroup`).
        k_glob, v_glob: ``[B, h, G, d]`` keys/values every query attends to (G may be 0).
        scale: 1/√d.
        drop: dropout on the attention weights, or None.
        bias: additive ``[h, blocks, S, K]`` halo scores (relative positions), or None.

    Returns:
        ``[B, h, H·W, d]``.
    """
    if bias is not None:
        return halo_scores(q, k, v, group, k_glob, v_glob, scale, drop, bias)
    p_drop = drop.p if drop is not None and drop.training else 0.0
    (nb, S, K), G = group.mask.shape, k_glob.shape[2]
    return block_attention(
        q,
        k,
        v,
        group.q_ids.view(nb, S),
        group.k_ids.view(nb, K),
        global_mask(group.mask, G),
        scale,
        p_drop,
        *((k_glob, v_glob) if G else (None, None)),
        out_ids=group.out_ids,
    )


def halo_scores(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    group: HaloBlocks,
    k_glob: Tensor,
    v_glob: Tensor,
    scale: float,
    drop: Optional[nn.Module],
    bias: Optional[Tensor],
) -> Tensor:
    """:func:`halo_attention` with the scores written out and an additive ``bias[h, blocks, S, K]`` (same arguments)."""
    B, h, _, d = q.shape
    (nb, S, K), G = group.mask.shape, k_glob.shape[2]
    q_blk = q.index_select(2, group.q_ids).view(B, h, nb, S, d)  # [B, h, blocks, S, d]
    k_blk = k.index_select(2, group.k_ids).view(B, h, nb, K, d)  # [B, h, blocks, K, d]
    v_blk = v.index_select(2, group.k_ids).view(B, h, nb, K, d)
    scores = (q_blk @ k_blk.transpose(-1, -2)) * scale  # QKᵀ over the halo: [B, h, blocks, S, K]
    scores = (scores + bias if bias is not None else scores).masked_fill(~group.mask, float("-inf"))
    if G:
        q_flat = q_blk.reshape(B, h, nb * S, d)  # [B, h, blocks·S, d]
        scores_glob = (q_flat @ k_glob.transpose(-1, -2)) * scale  # QKᵀ over the global keys: [B, h, blocks·S, G]
        scores = torch.cat([scores_glob.view(B, h, nb, S, G), scores], dim=-1)  # [B, h, blocks, S, G + K]
    attn = scores.softmax(dim=-1)
    attn = drop(attn) if drop is not None else attn
    attn_glob, attn_halo = attn.split([G, K], dim=-1)
    out = attn_halo @ v_blk  # AV over the halo: [B, h, blocks, S, d]
    if G:
        out = out + (attn_glob.reshape(B, h, nb * S, G) @ v_glob).view(B, h, nb, S, d)  # AV over the global keys
    return out.view(B, h, nb * S, d).index_select(2, group.out_ids)  # raster order: [B, h, H·W, d]
