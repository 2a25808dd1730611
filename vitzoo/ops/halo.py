"""Blocked (halo) neighbourhood attention: each query block over its halo of keys plus the global keys.

The blocks, halos and masks come from the backend (:class:`vitzoo.attention.sparse.halo.HaloGroup`, built from
the pattern's geometry); here they run through :func:`vitzoo.ops.gather.block_attention` (the compiled CPU
kernel or fused SDPA, as :mod:`vitzoo.ops.dispatch` picks), or, with a relative position bias that needs a
gradient (NAT's), with the scores written out (:func:`halo_scores`), in training through an autograd Function
that recomputes the blocks and the probabilities in backward (:class:`_HaloScores`).
"""
from __future__ import annotations

from typing import Any, Optional, Protocol

import torch
from torch import Tensor, nn

from vitzoo.ops import dispatch
from vitzoo.ops.gather import block_attention, global_mask

# A relative position bias: a table ``[c, T]`` per head and the entry ``rel[blocks, S, K]`` each (query slot,
# halo slot) reads; the halo scores get ``table[:, rel]``.
RelBias = tuple[Tensor, Tensor]


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
    bias: Optional[RelBias] = None,
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
        bias: relative position bias of the halo scores (:data:`RelBias`: ``table[h, T]``,
            ``rel[blocks, S, K]``), or None.

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
    bias: RelBias,
) -> Tensor:
    """:func:`halo_attention` with the scores written out and a relative position ``bias`` (same arguments).

    Training without attention dropout runs :class:`_HaloScores` (as :mod:`vitzoo.ops.dispatch` picks), which
    keeps only q, k, v, the global keys/values and a log-sum-exp per query slot; otherwise autograd records the
    plain ops below (the gathered blocks and the probabilities kept for backward).
    """
    p_drop = drop.p if drop is not None and drop.training else 0.0
    table, rel = bias
    if dispatch.select("halo_scores", q, k, v, p_drop) == "autograd_function":
        return _HaloScores.apply(q, k, v, k_glob, v_glob, table, rel, group.mask, group.q_ids, group.k_ids,
                                 group.out_ids, scale)
    q_blk, k_blk, v_blk = _blocks(q, k, v, group.q_ids, group.k_ids, group.mask.shape)
    attn = _halo_logits(q_blk, k_blk, k_glob, table[:, rel], group.mask, scale).softmax(dim=-1)
    attn = drop(attn) if drop is not None else attn
    return _halo_mix(attn, v_blk, v_glob, group.out_ids)


def _blocks(q: Tensor, k: Tensor, v: Tensor, q_ids: Tensor, k_ids: Tensor,
            shape: torch.Size) -> tuple[Tensor, Tensor, Tensor]:
    """Queries ``[B, c, blocks, S, d]`` and halo keys/values ``[B, c, blocks, K, d]`` of ``q, k, v[B, c, H·W, d]``
    (``shape``: the mask's ``(blocks, S, K)``)."""
    (B, c, _, d), (nb, S, K) = q.shape, shape
    q_blk = q.index_select(2, q_ids).view(B, c, nb, S, d)  # [B, c, blocks, S, d]
    k_blk = k.index_select(2, k_ids).view(B, c, nb, K, d)  # [B, c, blocks, K, d]
    v_blk = v.index_select(2, k_ids).view(B, c, nb, K, d)
    return q_blk, k_blk, v_blk


def _halo_logits(q_blk: Tensor, k_blk: Tensor, k_glob: Tensor, bias: Tensor, mask: Tensor, scale: float) -> Tensor:
    """Scores ``[B, c, blocks, S, G + K]``: the global keys' in front, the halo's with ``bias[c, blocks, S, K]`` added
    (in the bias' precision: fp32 under autocast) and ``-inf`` outside each query's neighbourhood."""
    B, c, nb, S, d = q_blk.shape
    G = k_glob.shape[2]
    scores = (q_blk @ k_blk.transpose(-1, -2)) * scale  # QKᵀ over the halo: [B, c, blocks, S, K]
    scores = (scores + bias).masked_fill(~mask, float("-inf"))
    if not G:
        return scores
    q_flat = q_blk.reshape(B, c, nb * S, d)  # [B, c, blocks·S, d]
    scores_glob = (q_flat @ k_glob.transpose(-1, -2)) * scale  # QKᵀ over the global keys: [B, c, blocks·S, G]
    return torch.cat([scores_glob.view(B, c, nb, S, G), scores], dim=-1)  # [B, c, blocks, S, G + K]


def _halo_mix(attn: Tensor, v_blk: Tensor, v_glob: Tensor, out_ids: Tensor) -> Tensor:
    """Weights ``attn[B, c, blocks, S, G + K]`` (cast to the values' dtype) times the global and halo values,
    in raster order: ``[B, c, H·W, d]``."""
    B, c, nb, S, _ = attn.shape
    G, d = v_glob.shape[2], v_blk.shape[-1]
    attn_glob, attn_halo = attn.to(v_blk.dtype).split([G, attn.shape[-1] - G], dim=-1)
    out = attn_halo @ v_blk  # AV over the halo: [B, c, blocks, S, d]
    if G:
        out = out + (attn_glob.reshape(B, c, nb * S, G) @ v_glob).view(B, c, nb, S, d)  # AV over the global keys
    return out.view(B, c, nb * S, d).index_select(2, out_ids)  # raster order: [B, c, H·W, d]


class _HaloScores(torch.autograd.Function):
    """:func:`halo_scores` without dropout, saving q, k, v, the global keys/values and the log-sum-exp of each
    query slot (the bias table, its indices, the mask and the ids are the module's own).

    Backward gathers the blocks again, recomputes the scores and, from the log-sum-exp, the probabilities
    (``P = exp(S - lse)``), and forms the gradients with matmuls in the forward's dtypes (the matmuls in q, k,
    v's dtype, the softmax in the scores'); ``rowsum(dO ⊙ O) = rowsum(P ⊙ dP)`` needs no output. The block
    gradients are added to the tokens they were gathered from (``index_add``), the bias gradient to its table.
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, k_glob: Tensor, v_glob: Tensor, table: Tensor,
                rel: Tensor, mask: Tensor, q_ids: Tensor, k_ids: Tensor, out_ids: Tensor, scale: float) -> Tensor:
        q_blk, k_blk, v_blk = _blocks(q, k, v, q_ids, k_ids, mask.shape)
        scores = _halo_logits(q_blk, k_blk, k_glob, table[:, rel], mask, scale)
        lse = scores.logsumexp(dim=-1)  # [B, c, blocks, S]
        ctx.save_for_backward(q, k, v, k_glob, v_glob, table, rel, mask, q_ids, k_ids, out_ids, lse)
        ctx.scale = scale
        return _halo_mix(scores.softmax(dim=-1), v_blk, v_glob, out_ids)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
        q, k, v, k_glob, v_glob, table, rel, mask, q_ids, k_ids, out_ids, lse = ctx.saved_tensors
        (B, c, _, d), (nb, S, K), G = q.shape, mask.shape, k_glob.shape[2]
        q_blk, k_blk, v_blk = _blocks(q, k, v, q_ids, k_ids, mask.shape)
        p = _halo_logits(q_blk, k_blk, k_glob, table[:, rel], mask, ctx.scale)
        p = p.sub_(lse[..., None]).exp_()  # probabilities, recomputed: [B, c, blocks, S, G + K]
        g_o = grad.new_zeros(B, c, nb * S, d).index_copy_(2, out_ids, grad)  # [B, c, blocks·S, d]: 0 at padding
        g_blk = g_o.view(B, c, nb, S, d)
        p_glob, p_halo = p.to(v.dtype).split([G, K], dim=-1)
        d_v_blk = p_halo.transpose(-1, -2) @ g_blk  # dV = Pᵀ dO over the halo: [B, c, blocks, K, d]
        d_v = v.new_zeros(v.shape).index_add_(2, k_ids, d_v_blk.view(B, c, nb * K, d))
        d_p = g_blk @ v_blk.transpose(-1, -2)  # dP = dO Vᵀ: [B, c, blocks, S, K]
        del d_v_blk, v_blk, p_halo
        d_kg = d_vg = None
        if G:
            d_vg = p_glob.reshape(B, c, nb * S, G).transpose(-1, -2) @ g_o  # [B, c, G, d]
            d_p = torch.cat([(g_o @ v_glob.transpose(-1, -2)).view(B, c, nb, S, G), d_p], dim=-1)  # [.., G + K]
        del g_o, g_blk, p_glob
        d_s = d_p.to(p.dtype).mul_(p)  # P ⊙ dP
        del d_p
        d_s.addcmul_(p, d_s.sum(-1, keepdim=True), value=-1)  # dS = P ⊙ (dP - rowsum(P ⊙ dP))
        del p
        d_table = None
        if ctx.needs_input_grad[5]:  # the bias: dS of the halo slots summed over images into its table entries
            d_bias = d_s[..., G:].sum(0).reshape(c, -1).to(table.dtype)  # [c, blocks·S·K]
            d_table = torch.zeros_like(table).index_add_(1, rel.flatten(), d_bias)
        d_s = d_s.to(q.dtype).mul_(ctx.scale)  # gradient of the products QKᵀ, in their dtype
        d_sg, d_sh = d_s.split([G, K], dim=-1)
        d_k_blk = d_sh.transpose(-1, -2) @ q_blk  # dK = dSᵀ Q: [B, c, blocks, K, d]
        d_k = k.new_zeros(k.shape).index_add_(2, k_ids, d_k_blk.view(B, c, nb * K, d))
        del d_k_blk
        d_q_blk = d_sh @ k_blk  # dQ = dS K: [B, c, blocks, S, d]
        del k_blk
        if G:
            d_sg = d_sg.reshape(B, c, nb * S, G)  # [B, c, blocks·S, G]
            d_q_blk = d_q_blk + (d_sg @ k_glob).view(B, c, nb, S, d)
            d_kg = d_sg.transpose(-1, -2) @ q_blk.reshape(B, c, nb * S, d)  # [B, c, G, d]
        d_q = q.new_zeros(q.shape).index_add_(2, q_ids, d_q_blk.view(B, c, nb * S, d))
        return d_q, d_k, d_v, d_kg, d_vg, d_table, None, None, None, None, None, None
