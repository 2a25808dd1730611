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
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def with_global(x: Tensor, x_glob: Tensor) -> Tensor:
    """``cat([x_glob[B, h, G, d], x[B, h, L, d]])`` along tokens: global ids 0..G-1, token t at G + t."""
    return torch.cat([x_glob, x], dim=2) if x_glob.shape[2] else x


def _joined(x: Tensor, x_glob: Optional[Tensor]) -> Tensor:
    """:func:`with_global` when there are global keys, ``x`` otherwise."""
    return x if x_glob is None else with_global(x, x_glob)


def global_ids(keys: Tensor, num_global: int) -> Tensor:
    """Per-block key ids ``keys[.., n, K]`` into a :func:`with_global` source: ``[.., n, G + K]`` (globals first)."""
    glob = torch.arange(num_global, device=keys.device).expand(*keys.shape[:-1], -1)  # [.., n, G]
    return torch.cat([glob, keys + num_global], dim=-1)


def global_mask(mask: Tensor, num_global: int) -> Tensor:
    """Boolean ``mask[.., n, S or 1, K]`` with G always-visible global keys in front: ``[.., n, S or 1, G + K]``."""
    return torch.cat([mask.new_ones(*mask.shape[:-1], num_global), mask], dim=-1) if num_global else mask


# Blocks per fused call: at most this many gathered key (or value) elements per image (at batch 4,
# 1 MB in float32), so
# that the blocks gathered again in backward and their gradients stay small and in cache (all
# blocks at once would hold ~11 copies of the keys for BigBird's 2x2 blocks). At 64x64 tokens,
# 2 threads: smaller chunks pay more per-call overhead, larger ones were slower and hold more.
GATHER_ELEMS = 1 << 16


def block_attention(q: Tensor, k: Tensor, v: Tensor, q_ids: Tensor, k_ids: Tensor, mask: Tensor, scale: float,
                    p_drop: float = 0.0, k_glob: Optional[Tensor] = None, v_glob: Optional[Tensor] = None) -> Tensor:
    """Blocks of S queries, each over its own gathered keys: fused SDPA, recomputed in backward.

    Block i's queries are ``q[..., q_ids[i], :]`` and its keys/values ``k[..., k_ids[i], :]``. The
    blocks run in chunks of at most :data:`GATHER_ELEMS` gathered elements per image, one SDPA call each. For
    training on the CPU without dropout or autocast, backward gathers the chunk's blocks again and runs the
    flash kernel's backward from the saved output and log-sum-exp (:class:`_BlockSDPA`): neither
    the gathered keys/values nor the probabilities are stored. Elsewhere with a gradient each call
    is checkpointed (recomputed in backward).

    Args:
        q: ``[B, c, L_q, d]`` queries of c heads that share the blocks.
        k, v: ``[B, c, L_k, d]`` keys/values.
        q_ids: ``[n, S]`` query ids of each block.
        k_ids: ``[n, K]`` key ids of each block, or ``[c, n, K]``: per head (BigBird's random blocks).
        mask: ``[n, S or 1, K]`` booleans (no all-False row), or ``[c, n, S or 1, K]`` per head.
        scale: 1/√d.
        p_drop: dropout on the attention weights.
        k_glob, v_glob: ``[B, c, G, d]`` keys/values placed in front of ``k``/``v`` (:func:`with_global`;
            the ids count them), joined inside so that the joined copy is not saved; None: none.

    Returns:
        ``[B, c, n·S, d]`` in block order.
    """
    if torch.is_grad_enabled() and not torch.jit.is_tracing() and any(t.requires_grad for t in (q, k, v)):
        same = all(t is None or t.dtype == q.dtype for t in (k, v, k_glob, v_glob))
        if q.device.type == "cpu" and p_drop == 0.0 and same and not torch.is_autocast_enabled("cpu"):
            return _BlockSDPA.apply(q, k, v, k_glob, v_glob, q_ids, k_ids, mask, scale)
        return checkpoint(_block_sdpa, q, k, v, k_glob, v_glob, q_ids, k_ids, mask, scale, p_drop, use_reentrant=False)
    return _block_sdpa(q, k, v, k_glob, v_glob, q_ids, k_ids, mask, scale, p_drop)


def _chunks(q: Tensor, k_ids: Tensor) -> list[slice]:
    """Block ranges of the fused calls: at most :data:`GATHER_ELEMS` gathered key elements per image each."""
    (_, c, _, d), (n, K) = q.shape, k_ids.shape[-2:]
    step = max(1, GATHER_ELEMS // (c * K * d))  # not by batch size: exported graphs keep it dynamic
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def _flat_ids(ids: Tensor, part: slice, length: int) -> Tensor:
    """Per-head ids ``[c, n, X]`` of blocks ``part`` into tokens flattened over heads (``c·length``)."""
    offset = torch.arange(ids.shape[0], device=ids.device)[:, None, None] * length
    return (ids[:, part] + offset).flatten()


def _select(t: Tensor, ids: Tensor, part: slice) -> Tensor:
    """``t[B, c, L, d]`` gathered for blocks ``part`` of ``ids`` (``[n, X]`` shared or ``[c, n, X]`` per head) -> ``[B, c·m, X, d]``."""
    B, c, L, d = t.shape
    m = part.stop - part.start
    if ids.dim() == 2:
        return t.index_select(2, ids[part].flatten()).view(B, c * m, -1, d)
    return t.reshape(B, c * L, d).index_select(1, _flat_ids(ids, part, L)).view(B, c * m, -1, d)


def _add_back(dst: Tensor, ids: Tensor, part: slice, grad: Tensor) -> None:
    """Adds block gradients ``grad[B, c·m, X, d]`` to the tokens of contiguous ``dst[B, c, L, d]`` they came from."""
    B, c, L, d = dst.shape
    if ids.dim() == 2:
        dst.index_add_(2, ids[part].flatten(), grad.reshape(B, c, -1, d))
    else:
        dst.view(B, c * L, d).index_add_(1, _flat_ids(ids, part, L), grad.reshape(B, -1, d))


def _heads_mask(mask: Tensor, part: slice, c: int) -> Tensor:
    """Blocks ``part`` of ``mask`` (``[n, S or 1, K]`` shared or ``[c, n, S or 1, K]``) for c heads: ``[1, c·m, S or 1, K]``."""
    mask = mask[part].expand(c, -1, -1, -1) if mask.dim() == 3 else mask[:, part]
    return mask.flatten(0, 1)[None]


def _block_sdpa(q: Tensor, k: Tensor, v: Tensor, k_glob: Optional[Tensor], v_glob: Optional[Tensor], q_ids: Tensor,
                k_ids: Tensor, mask: Tensor, scale: float, p_drop: float) -> Tensor:
    """:func:`block_attention` through ``F.scaled_dot_product_attention`` (same arguments) -> ``[B, c, n·S, d]``."""
    B, c, _, d = q.shape
    k, v = _joined(k, k_glob), _joined(v, v_glob)
    outs = []
    for part in _chunks(q, k_ids):
        out = F.scaled_dot_product_attention(_select(q, q_ids, part), _select(k, k_ids, part), _select(v, k_ids, part),
                                             attn_mask=_heads_mask(mask, part, c), dropout_p=p_drop,
                                             scale=scale)  # [B, c·m, S, d]
        outs.append(out.view(B, c, -1, d))
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


class _BlockSDPA(torch.autograd.Function):
    """One call of :func:`block_attention` on the CPU flash kernel, saving only its output and log-sum-exp.

    Backward gathers the blocks again (cheap copies) and calls the kernel's backward; the block
    gradients are added back to the tokens they were gathered from (``index_add``).
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, k_grid: Tensor, v_grid: Tensor, k_glob: Optional[Tensor], v_glob: Optional[Tensor],
                q_ids: Tensor, k_ids: Tensor, mask: Tensor, scale: float) -> Tensor:
        (B, c, _, d), (n, S) = q.shape, q_ids.shape
        k, v = _joined(k_grid, k_glob), _joined(v_grid, v_glob)
        bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))  # additive
        out, lse = q.new_empty(B, c, n, S, d), q.new_empty(B, c, n, S)
        for part in _chunks(q, k_ids):
            m = part.stop - part.start
            o, l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                _select(q, q_ids, part), _select(k, k_ids, part), _select(v, k_ids, part), 0.0, False,
                attn_mask=_heads_mask(bias, part, c), scale=scale)  # [B, c·m, S, d], [B, c·m, S]
            out[:, :, part] = o.view(B, c, m, S, d)
            lse[:, :, part] = l.view(B, c, m, S)
        ctx.save_for_backward(q, k_grid, v_grid, k_glob, v_glob, q_ids, k_ids, bias, out, lse)
        ctx.scale = scale
        return out.view(B, c, n * S, d)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
        q, k_grid, v_grid, k_glob, v_glob, q_ids, k_ids, bias, out, lse = ctx.saved_tensors
        (B, c, _, d), (n, S) = q.shape, q_ids.shape
        k, v = _joined(k_grid, k_glob), _joined(v_grid, v_glob)  # joined again, not saved
        grad = grad.to(out.dtype).view(B, c, n, S, d)
        d_q, d_k, d_v = (torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))  # contiguous
        for part in _chunks(q, k_ids):
            m = part.stop - part.start
            g_q, g_k, g_v = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad[:, :, part].reshape(B, c * m, S, d), _select(q, q_ids, part), _select(k, k_ids, part),
                _select(v, k_ids, part), out[:, :, part].reshape(B, c * m, S, d), lse[:, :, part].reshape(B, c * m, S),
                0.0, False, attn_mask=_heads_mask(bias, part, c), scale=ctx.scale)
            _add_back(d_q, q_ids, part, g_q)
            _add_back(d_k, k_ids, part, g_k)
            _add_back(d_v, k_ids, part, g_v)
        G = 0 if k_glob is None else k_glob.shape[2]
        d_kg, d_vg = (d_k[:, :, :G], d_v[:, :, :G]) if k_glob is not None else (None, None)
        return d_q, d_k[:, :, G:], d_v[:, :, G:], d_kg, d_vg, None, None, None, None
