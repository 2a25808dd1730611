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
from vitzoo.ops.common import slices
from vitzoo.ops.gather import FORWARD_SCALE, block_attention, chunk_blocks, global_mask

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


def _slot_mix(attn: Tensor, v_blk: Tensor, v_glob: Tensor) -> Tensor:
    """Weights ``attn[B, c, blocks, S, G + K]`` (cast to the values' dtype) times the global and halo values, by
    query slot: ``[B, c, blocks, S, d]``."""
    B, c, nb, S, _ = attn.shape
    G, d = v_glob.shape[2], v_blk.shape[-1]
    attn_glob, attn_halo = attn.to(v_blk.dtype).split([G, attn.shape[-1] - G], dim=-1)
    out = attn_halo @ v_blk  # AV over the halo: [B, c, blocks, S, d]
    if G:
        out = out + (attn_glob.reshape(B, c, nb * S, G) @ v_glob).view(B, c, nb, S, d)  # AV over the global keys
    return out


def _halo_mix(attn: Tensor, v_blk: Tensor, v_glob: Tensor, out_ids: Tensor) -> Tensor:
    """:func:`_slot_mix` in raster order: ``[B, c, H·W, d]``."""
    B, c, nb, S, _ = attn.shape
    return _slot_mix(attn, v_blk, v_glob).view(B, c, nb * S, -1).index_select(2, out_ids)


class _HaloScores(torch.autograd.Function):
    """:func:`halo_scores` without dropout, saving q, k, v, the global keys/values and the log-sum-exp of each
    query slot (the bias table, its indices, the mask and the ids are the module's own).

    Forward and backward run chunk by chunk of query blocks (:func:`~vitzoo.ops.gather.chunk_blocks` blocks each,
    :data:`~vitzoo.ops.gather.FORWARD_SCALE` times more in forward), so that one chunk's blocks, scores and their
    gradients are what a call holds beside the outputs or gradients. Backward gathers the blocks
    again, recomputes the scores and, from the log-sum-exp, the probabilities (``P = exp(S - lse)``), and forms
    the gradients with matmuls in the forward's dtypes (the matmuls in q, k, v's dtype, the softmax in the
    scores'); ``rowsum(dO ⊙ O) = rowsum(P ⊙ dP)`` needs no output. The block gradients are added to the tokens
    they were gathered from (``index_add``), the bias gradient to its table.
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, k_glob: Tensor, v_glob: Tensor, table: Tensor,
                rel: Tensor, mask: Tensor, q_ids: Tensor, k_ids: Tensor, out_ids: Tensor, scale: float) -> Tensor:
        (B, c, _, d), (nb, S, K), G = q.shape, mask.shape, k_glob.shape[2]
        ids_q, ids_k = q_ids.view(nb, S), k_ids.view(nb, K)
        lse, slots = [], []
        for part in slices(nb, chunk_blocks(c, G + K, d, FORWARD_SCALE)):
            q_blk, k_blk, v_blk = _blocks(q, k, v, ids_q[part].flatten(), ids_k[part].flatten(), mask[part].shape)
            scores = _halo_logits(q_blk, k_blk, k_glob, table[:, rel[part]], mask[part], scale)
            lse.append(scores.logsumexp(dim=-1))  # [B, c, m, S]
            slots.append(_slot_mix(scores.softmax(dim=-1), v_blk, v_glob))  # [B, c, m, S, d]
        lse = torch.cat(lse, dim=2)  # [B, c, blocks, S]
        ctx.save_for_backward(q, k, v, k_glob, v_glob, table, rel, mask, q_ids, k_ids, out_ids, lse)
        ctx.scale = scale
        return torch.cat(slots, dim=2).view(B, c, nb * S, -1).index_select(2, out_ids)  # raster order: [B, c, H·W, d]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
        q, k, v, k_glob, v_glob, table, rel, mask, q_ids, k_ids, out_ids, lse = ctx.saved_tensors
        (B, c, _, d), (nb, S, K), G = q.shape, mask.shape, k_glob.shape[2]
        g_o = grad.new_zeros(B, c, nb * S, d).index_copy_(2, out_ids, grad)  # [B, c, blocks·S, d]: 0 at padding
        grads = _HaloGrads(q, k, v, k_glob, v_glob, table if ctx.needs_input_grad[5] else None)
        q_ids, k_ids = q_ids.view(nb, S), k_ids.view(nb, K)
        for part in slices(nb, chunk_blocks(c, G + K, d)):
            g_blk = g_o.view(B, c, nb, S, d)[:, :, part]  # [B, c, m, S, d]
            _halo_backward(grads, q, k, v, k_glob, v_glob, table, rel[part], mask[part], q_ids[part].flatten(),
                           k_ids[part].flatten(), lse[:, :, part], g_blk, ctx.scale)
        return (grads.q, grads.k, grads.v, grads.k_glob, grads.v_glob, grads.table, None, None, None, None, None,
                None)


class _HaloGrads:
    """The gradients :class:`_HaloScores`'s backward adds up chunk by chunk (None where there is none)."""

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, k_glob: Tensor, v_glob: Tensor, table: Optional[Tensor]):
        self.q, self.k, self.v = (t.new_zeros(t.shape) for t in (q, k, v))
        G = k_glob.shape[2]
        self.k_glob = k_glob.new_zeros(k_glob.shape) if G else None
        self.v_glob = v_glob.new_zeros(v_glob.shape) if G else None
        self.table = torch.zeros_like(table) if table is not None else None


def _halo_backward(grads: _HaloGrads, q: Tensor, k: Tensor, v: Tensor, k_glob: Tensor, v_glob: Tensor,
                   table: Tensor, rel: Tensor, mask: Tensor, q_ids: Tensor, k_ids: Tensor, lse: Tensor, g_blk: Tensor,
                   scale: float) -> None:
    """Add one chunk of m query blocks' gradients to ``grads``: its blocks gathered again, its scores and, from
    the log-sum-exp ``lse[B, c, m, S]``, its probabilities recomputed (``rel[m, S, K]``, ``mask[m, S, K]``,
    ``q_ids[m·S]``, ``k_ids[m·K]``; ``g_blk[B, c, m, S, d]`` the output gradient of its query slots)."""
    (B, c, _, d), (m, S, K), G = q.shape, mask.shape, k_glob.shape[2]
    q_blk, k_blk, v_blk = _blocks(q, k, v, q_ids, k_ids, mask.shape)
    p = _halo_logits(q_blk, k_blk, k_glob, table[:, rel], mask, scale)
    p = p.sub_(lse[..., None]).exp_()  # probabilities, recomputed: [B, c, m, S, G + K]
    p_glob, p_halo = p.to(v.dtype).split([G, K], dim=-1)
    d_v_blk = p_halo.transpose(-1, -2) @ g_blk  # dV = Pᵀ dO over the halo: [B, c, m, K, d]
    grads.v.index_add_(2, k_ids, d_v_blk.reshape(B, c, m * K, d))
    d_p = g_blk @ v_blk.transpose(-1, -2)  # dP = dO Vᵀ: [B, c, m, S, K]
    del d_v_blk, v_blk, p_halo
    g_o = g_blk.reshape(B, c, m * S, d)  # [B, c, m·S, d]
    if G:
        grads.v_glob += p_glob.reshape(B, c, m * S, G).transpose(-1, -2) @ g_o  # [B, c, G, d]
        d_p = torch.cat([(g_o @ v_glob.transpose(-1, -2)).view(B, c, m, S, G), d_p], dim=-1)  # [.., G + K]
    del g_o, p_glob
    d_s = d_p.to(p.dtype).mul_(p)  # P ⊙ dP
    del d_p
    d_s.addcmul_(p, d_s.sum(-1, keepdim=True), value=-1)  # dS = P ⊙ (dP - rowsum(P ⊙ dP))
    del p
    if grads.table is not None:  # the bias: dS of the halo slots summed over images into its table entries
        d_bias = d_s[..., G:].sum(0).reshape(c, -1).to(table.dtype)  # [c, m·S·K]
        grads.table.index_add_(1, rel.flatten(), d_bias)
    d_s = d_s.to(q.dtype).mul_(scale)  # gradient of the products QKᵀ, in their dtype
    d_sg, d_sh = d_s.split([G, K], dim=-1)
    d_k_blk = d_sh.transpose(-1, -2) @ q_blk  # dK = dSᵀ Q: [B, c, m, K, d]
    grads.k.index_add_(2, k_ids, d_k_blk.reshape(B, c, m * K, d))
    del d_k_blk
    d_q_blk = d_sh @ k_blk  # dQ = dS K: [B, c, m, S, d]
    del k_blk
    if G:
        d_sg = d_sg.reshape(B, c, m * S, G)  # [B, c, m·S, G]
        d_q_blk = d_q_blk + (d_sg @ k_glob).view(B, c, m, S, d)
        grads.k_glob += d_sg.transpose(-1, -2) @ q_blk.reshape(B, c, m * S, d)  # [B, c, G, d]
    grads.q.index_add_(2, q_ids, d_q_blk.reshape(B, c, m * S, d))
