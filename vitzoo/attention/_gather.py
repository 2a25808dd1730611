"""Gathered key lists: the kernels of BigBird's block groups (:mod:`vitzoo.attention.bigbird`).

Paper: Zaheer et al., "Big Bird: Transformers for Longer Sequences", NeurIPS 2020,
https://arxiv.org/abs/2007.14062 (block-sparse attention over gathered key blocks).

Queries come in n blocks of S tokens that share one list of keys: the G global keys every query
sees, then the block's own K keys. :func:`block_attention` gathers them with ``index_select`` and
runs one fused SDPA call per chunk of blocks, ``[B, c·n, S, d]`` against ``[B, c·n, G + K, d]``;
scores ``[B, h, N, N]`` never exist. In training the gathered keys/values and the probabilities
are recomputed in backward instead of being stored. Used by BigBird's block groups through
:class:`vitzoo.attention._sparse.SparsePatternAttention` and by the halo groups
(:mod:`vitzoo.attention._halo`).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vitzoo.attention.base import Grid


def pad_grid(x: Tensor, grid: Grid, padded: Grid) -> Tensor:
    """``x[B, h, H·W, d]`` zero-padded at the bottom/right to ``[B, h, H'·W', d]``."""
    if tuple(padded) == tuple(grid):
        return x
    (H, W), (Hp, Wp) = grid, padded
    B, h, _, d = x.shape
    x = F.pad(x.reshape(B, h, H, W, d), (0, 0, 0, Wp - W, 0, Hp - H))  # [B, h, H', W', d]
    return x.reshape(B, h, Hp * Wp, d)  # [B, h, L', d]


def with_global(x: Tensor, x_glob: Tensor) -> Tensor:
    """``cat([x_glob[B, h, G, d], x[B, h, L, d]])`` along tokens: global ids 0..G-1, token t at G + t."""
    return torch.cat([x_glob, x], dim=2) if x_glob.shape[2] else x


def global_ids(keys: Tensor, num_global: int) -> Tensor:
    """Per-block key ids ``keys[n, K]`` into a :func:`with_global` source: ``[n, G + K]`` (globals first)."""
    glob = torch.arange(num_global, device=keys.device).expand(keys.shape[0], -1)  # [n, G]
    return torch.cat([glob, keys + num_global], dim=1)


def global_mask(mask: Tensor, num_global: int) -> Tensor:
    """Boolean ``mask[n, S or 1, K]`` with G always-visible global keys in front: ``[n, S or 1, G + K]``."""
    return torch.cat([mask.new_ones(*mask.shape[:2], num_global), mask], dim=-1) if num_global else mask


# Blocks per fused call: at most this many gathered key (or value) elements per call, so that the
# blocks gathered again in backward and their gradients stay a few MB (one call per head otherwise
# holds ~11 copies of its keys for BigBird's 2x2 blocks).
GATHER_ELEMS = 1 << 21


def block_attention(q: Tensor, k: Tensor, v: Tensor, q_ids: Tensor, k_ids: Tensor, mask: Tensor, scale: float,
                    p_drop: float = 0.0) -> Tensor:
    """Blocks of S queries, each over its own gathered keys: fused SDPA, recomputed in backward.

    Block i's queries are ``q[..., q_ids[i], :]`` and its keys/values ``k[..., k_ids[i], :]``. The
    blocks run in chunks of at most :data:`GATHER_ELEMS` gathered elements, one SDPA call each. For
    training on the CPU without dropout, backward gathers the chunk's blocks again and runs the
    flash kernel's backward from the saved output and log-sum-exp (:class:`_BlockSDPA`): neither
    the gathered keys/values nor the probabilities are stored. Elsewhere with a gradient each call
    is checkpointed (recomputed in backward).

    Args:
        q: ``[B, c, L_q, d]`` queries of c heads that share the blocks.
        k, v: ``[B, c, L_k, d]`` keys/values (with the global keys, see :func:`with_global`).
        q_ids: ``[n, S]`` query ids of each block.
        k_ids: ``[n, K]`` key ids of each block.
        mask: ``[n, S or 1, K]`` booleans (no all-False row).
        scale: 1/√d.
        p_drop: dropout on the attention weights.

    Returns:
        ``[B, c, n·S, d]`` in block order.
    """
    B, c, _, d = q.shape
    n, K = k_ids.shape
    step = max(1, GATHER_ELEMS // (B * c * K * d))  # blocks per call
    grad = torch.is_grad_enabled() and not torch.jit.is_tracing() and any(t.requires_grad for t in (q, k, v))
    outs = []
    for i in range(0, n, step):
        part = (q, k, v, q_ids[i:i + step].flatten(), k_ids[i:i + step].flatten(), mask[i:i + step], scale)
        if not grad:
            outs.append(_block_sdpa(*part, p_drop))
        elif q.device.type == "cpu" and p_drop == 0.0:
            outs.append(_BlockSDPA.apply(*part))
        else:
            outs.append(checkpoint(_block_sdpa, *part, p_drop, use_reentrant=False))
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


def _gather_blocks(q: Tensor, k: Tensor, v: Tensor, q_ids: Tensor, k_ids: Tensor,
                   n: int) -> tuple[Tensor, Tensor, Tensor]:
    """The n blocks of one call: ``[B, c·n, S, d]`` queries, ``[B, c·n, K, d]`` keys and values."""
    B, c, _, d = q.shape
    return tuple(t.index_select(2, ids).view(B, c * n, -1, d) for t, ids in ((q, q_ids), (k, k_ids), (v, k_ids)))


def _heads_mask(mask: Tensor, c: int) -> Tensor:
    """Boolean ``mask[n, S or 1, K]`` repeated for c heads: ``[1, c·n, S or 1, K]``."""
    return mask.expand(c, -1, -1, -1).flatten(0, 1)[None]


def _block_sdpa(q: Tensor, k: Tensor, v: Tensor, q_ids: Tensor, k_ids: Tensor, mask: Tensor, scale: float,
                p_drop: float) -> Tensor:
    """One call of :func:`block_attention` through ``F.scaled_dot_product_attention`` -> ``[B, c, n·S, d]``."""
    B, c, _, d = q.shape
    q_blk, k_blk, v_blk = _gather_blocks(q, k, v, q_ids, k_ids, mask.shape[0])  # [B, c·n, S or K, d]
    out = F.scaled_dot_product_attention(q_blk, k_blk, v_blk, attn_mask=_heads_mask(mask, c), dropout_p=p_drop,
                                         scale=scale)  # [B, c·n, S, d]
    return out.view(B, c, -1, d)


class _BlockSDPA(torch.autograd.Function):
    """One call of :func:`block_attention` on the CPU flash kernel, saving only its output and log-sum-exp.

    Backward gathers the blocks again (cheap copies) and calls the kernel's backward; the block
    gradients are added back to the tokens they were gathered from (``index_add``).
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, q_ids: Tensor, k_ids: Tensor, mask: Tensor,
                scale: float) -> Tensor:
        B, c, _, d = q.shape
        bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
        bias = _heads_mask(bias, c)  # additive: [1, c·n, S or 1, K]
        q_blk, k_blk, v_blk = _gather_blocks(q, k, v, q_ids, k_ids, mask.shape[0])
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q_blk, k_blk, v_blk, 0.0, False, attn_mask=bias, scale=scale)  # [B, c·n, S, d], [B, c·n, S]
        ctx.save_for_backward(q, k, v, q_ids, k_ids, bias, out, lse)
        ctx.scale, ctx.n = scale, mask.shape[0]
        return out.view(B, c, -1, d)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
        q, k, v, q_ids, k_ids, bias, out, lse = ctx.saved_tensors
        B, c, _, d = q.shape
        q_blk, k_blk, v_blk = _gather_blocks(q, k, v, q_ids, k_ids, ctx.n)
        g_q, g_k, g_v = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad.reshape(out.shape), q_blk, k_blk, v_blk, out, lse, 0.0, False, attn_mask=bias, scale=ctx.scale)
        del q_blk, k_blk, v_blk
        d_q = torch.zeros_like(q).index_add_(2, q_ids, g_q.reshape(B, c, -1, d))
        d_k = torch.zeros_like(k).index_add_(2, k_ids, g_k.reshape(B, c, -1, d))
        d_v = torch.zeros_like(v).index_add_(2, k_ids, g_v.reshape(B, c, -1, d))
        return d_q, d_k, d_v, None, None, None, None
