"""Gathered key lists: the kernels of BigBird's block groups (:mod:`vitzoo.attention.sparse.bigbird`).

Paper: Zaheer et al., "Big Bird: Transformers for Longer Sequences", NeurIPS 2020,
https://arxiv.org/abs/2007.14062 (block-sparse attention over gathered key blocks).

Queries come in n blocks of S tokens that share one list of keys: the G global keys every query sees, then the
block's own K keys. On the CPU (float32/float64) :func:`block_attention` runs vitzoo's compiled kernel
(:mod:`vitzoo.cpu_kernels.block_kernel`); otherwise, and where it cannot be built, it gathers them with
``index_select`` and runs one fused SDPA call per chunk of blocks, ``[B, c·n, S, d]`` against ``[B, c·n, G + K, d]``.
Scores ``[B, h, N, N]`` never exist. In training the gathered keys/values and the probabilities are recomputed in
backward instead of being stored. Used by BigBird's block groups through
:class:`vitzoo.attention.sparse.pattern.SparsePatternAttention` and by the halo groups (:mod:`vitzoo.ops.halo`).
Which path runs a call is ``block_attention`` in :mod:`vitzoo.ops.dispatch`.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from vitzoo.cpu_kernels import block_kernel
from vitzoo.ops import dispatch
from vitzoo.ops import sdpa as sdpa_ops
from vitzoo.ops.common import LOG2E, slices, tracing


def global_mask(mask: Tensor, num_global: int) -> Tensor:
    """Boolean ``mask[.., n, S or 1, K]`` with G always-visible global keys in front: ``[.., n, S or 1, G + K]``."""
    return torch.cat([mask.new_ones(*mask.shape[:-1], num_global), mask], dim=-1) if num_global else mask


def select_rows(x: Tensor, ids: Tensor) -> Tensor:
    """Rows ``ids[L]`` of ``x[B, c, M, d]``: ``[B, c, L, d]``, a view of a token-major ``[B, L, c, d]`` buffer."""
    return x.transpose(1, 2).index_select(1, ids).transpose(1, 2)


def head_parts(t: Tensor, sizes: list[int]) -> tuple[Tensor, ...]:
    """``t[B, h, .., d]`` cut into head groups of ``sizes`` with one split (its backward joins the groups'
    gradients in one tensor, where slicing would pad each to all h heads); ``(t,)`` for one group."""
    return t.split(sizes, dim=1) if len(sizes) > 1 else (t,)


def split_prefix(t: Tensor, prefix: int) -> tuple[Tensor, Tensor]:
    """``t[B, h, P + L, d]`` -> prefix ``[B, h, P, d]`` and grid ``[B, h, L, d]`` (``t`` itself when P = 0: no copy
    in backward)."""
    return (t[:, :, :0], t) if not prefix else t.split([prefix, t.shape[2] - prefix], dim=2)


# Blocks per fused call: at most this many gathered key (or value) elements per image (at batch 4, 1 MB in float32),
# so that the blocks gathered again in backward and their gradients stay small and in cache (all blocks at once
# would hold ~11 copies of the keys for BigBird's 2x2 blocks). At 64x64 tokens, 2 threads: smaller chunks pay
# more per-call overhead, larger ones were slower and hold more.
GATHER_ELEMS = 1 << 16
# Forward-only calls (training's forward, inference) hold no gradients: chunks this many times larger.
FORWARD_SCALE = 4


def block_attention(q: Tensor, k: Tensor, v: Tensor, q_ids: Tensor, k_ids: Tensor, mask: Tensor, scale: float,
                    p_drop: float = 0.0, k_glob: Optional[Tensor] = None, v_glob: Optional[Tensor] = None,
                    out_ids: Optional[Tensor] = None) -> Tensor:
    """Blocks of S queries, each over the global keys and its own gathered keys: fused SDPA, recomputed in backward.

    Block i's queries are ``q[..., q_ids[i], :]`` and its keys/values the G global ones followed by
    ``k[..., k_ids[i], :]``. On the CPU in float32/float64 without dropout (not traced), vitzoo's compiled
    kernel runs them (:mod:`vitzoo.cpu_kernels.block_kernel`: one task per image and head, nothing gathered in
    memory, backward from the saved log-sum-exp). Otherwise the blocks run in chunks of at most
    :data:`GATHER_ELEMS` gathered elements per image, one SDPA call each. For training on the CPU without dropout
    or autocast, backward gathers the chunk's blocks again and recomputes their probabilities from the saved
    log-sum-exp (:class:`_BlockSDPA`): neither the gathered keys/values, the probabilities nor the output are
    stored. Elsewhere with a gradient each chunk is checkpointed (recomputed in backward, one chunk at a time).

    Args:
        q: ``[B, c, L_q, d]`` queries of c heads that share the blocks.
        k, v: ``[B, c, L_k, d]`` keys/values.
        q_ids: ``[n, S]`` query ids of each block.
        k_ids: ``[n, K]`` key ids of each block, or ``[c, n, K]``: per head (BigBird's random blocks).
        mask: ``[n, S or 1, G + K]`` booleans (no all-False row), or ``[c, n, S or 1, G + K]`` per head.
        scale: 1/√d.
        p_drop: dropout on the attention weights.
        k_glob, v_glob: ``[B, c, G, d]`` keys/values every block sees in front of its own (joined per
            chunk, so that no joined copy of ``k``/``v`` exists); None: none.
        out_ids: ``[L_out]`` block slot (in ``n·S``) of each output row (outputs of other slots are
            dropped and get no gradient); None: every slot in block order.

    Returns:
        ``[B, c, L_out, d]``, or ``[B, c, n·S, d]`` in block order.
    """
    path = dispatch.select("block_attention", q, k, v, k_glob, v_glob, p_drop)
    if path == "autograd_function":
        return _BlockSDPA.apply(q, k, v, k_glob, v_glob, q_ids, k_ids, mask, out_ids, scale)
    if path == "checkpoint":
        return _block_sdpa(q, k, v, k_glob, v_glob, q_ids, k_ids, mask, out_ids, scale, p_drop, recompute=True)
    if path == "cpu_kernel":  # inference
        return _kernel_forward(q, k, v, k_glob, v_glob, q_ids, k_ids, mask, out_ids, scale)[0]
    return _block_sdpa(q, k, v, k_glob, v_glob, q_ids, k_ids, mask, out_ids, scale, p_drop)


def chunk_blocks(heads: int, keys: int, head_dim: int, scale: int = 1) -> int:
    """Blocks per fused call: at most ``scale`` × :data:`GATHER_ELEMS` gathered key elements per image (not by batch
    size: exported graphs keep it dynamic)."""
    return max(1, scale * GATHER_ELEMS // (heads * keys * head_dim))


def _chunks(q: Tensor, k_ids: Tensor, scale: int = 1) -> list[slice]:
    """Block ranges of the fused calls, :func:`chunk_blocks` blocks each."""
    (_, c, _, d), (n, K) = q.shape, k_ids.shape[-2:]
    return slices(n, chunk_blocks(c, K, d, scale))


def _token_rows(t: Tensor) -> tuple[Tensor, int, int, int]:
    """``t[B, c, L, d]`` as rows of d elements ``[R, d]`` and the row steps of an image, a head and a token.

    A view of ``t``'s storage where the strides allow it (the q/k/v views of a fused projection: no
    copy of the whole tensor per call), a contiguous copy otherwise, where ``t`` needs a gradient
    through this view, or while tracing (an exported graph has no storage to view: ONNX's as_strided
    would read the view as if it were contiguous).
    """
    d = t.shape[-1]
    if (tracing() or t.stride(-1) != 1 or any(s % d for s in t.stride()[:3])
            or (torch.is_grad_enabled() and t.requires_grad)):
        t = t.contiguous()
    s_b, s_c, s_l = (s // d for s in t.stride()[:3])
    rows = sum((n - 1) * s for n, s in zip(t.shape[:3], (s_b, s_c, s_l))) + 1
    return t.as_strided((rows, d), (d, 1)), s_b, s_c, s_l


def _select(t: Tensor, ids: Tensor, part: slice) -> Tensor:
    """``t[B, c, L, d]`` gathered for blocks ``part`` of ids ``[n, X]`` shared by the heads -> ``[B, c·m, X, d]``."""
    B, c, L, d = t.shape
    return t.index_select(2, ids[part].flatten()).view(B, c * (part.stop - part.start), -1, d)


def _head_offsets(ids: Tensor, *axes: tuple[int, int]) -> Tensor:
    """Row offsets of leading axes ``(size, step)`` (images, heads): ``Σ arange(size)·step`` as
    ``[size_1, .., 1, 1]``, to add to ids ``[c, m, X]``."""
    out = torch.zeros((), dtype=ids.dtype, device=ids.device)
    for size, step in axes:
        out = out[..., None] + torch.arange(size, device=ids.device) * step
    return out[..., None, None]


class _KeyRows:
    """One call's keys and values ``k, v[B, c, L, d]`` gathered for blocks of ``ids`` (``[n, X]`` shared or
    ``[c, n, X]`` per head), with the global ``k_glob, v_glob[B, c, G, d]`` (or None) in front.

    Per-head ids read rows of :func:`_token_rows` views made once per call; their image and head offsets
    are computed once too, so that a block range costs one ``add`` for its row ids.
    """

    def __init__(self, k: Tensor, v: Tensor, k_glob: Optional[Tensor], v_glob: Optional[Tensor], ids: Tensor):
        self.ids, self.glob, self.shape = ids, (k_glob, v_glob), k.shape
        if ids.dim() == 2:
            self.sources, self.steps, self.offsets = (k, v), None, None
            return
        (k_rows, *k_steps), (v_rows, *v_steps) = _token_rows(k), _token_rows(v)
        B, c = k.shape[:2]
        self.sources, self.steps = (k_rows, v_rows), (k_steps[2], v_steps[2])
        self.offsets = [_head_offsets(ids, (B, s_b), (c, s_c)) for s_b, s_c, _ in (k_steps, v_steps)]  # [B, c, 1, 1]

    def __call__(self, part: slice) -> tuple[Tensor, Tensor]:
        """Keys and values of blocks ``part``: ``[B, c·m, G + X, d]`` each."""
        return tuple(self._one(i, part) for i in range(2))

    def _one(self, i: int, part: slice) -> Tensor:
        B, c, _, d = self.shape
        if self.offsets is None:
            sel = _select(self.sources[i], self.ids, part)
        else:
            index = torch.add(self.offsets[i], self.ids[:, part], alpha=self.steps[i])  # [B, c, m, X] rows
            sel = self.sources[i].index_select(0, index.view(-1)).view(B, c * (part.stop - part.start), -1, d)
        glob = self.glob[i]
        if glob is None or not glob.shape[2]:
            return sel
        G = glob.shape[2]
        glob = glob[:, :, None].expand(B, c, part.stop - part.start, G, d).reshape(B, -1, G, d)  # [B, c·m, G, d]
        return torch.cat([glob, sel], dim=2)


def _add_query_back(dst: Tensor, ids: Tensor, part: slice, grad: Tensor) -> None:
    """Adds query gradients ``grad[B, c·m, S, d]`` of blocks ``part`` (ids ``[n, S]``, shared by the heads) to the
    tokens of contiguous ``dst[B, c, L, d]`` they came from."""
    B, c, _, d = dst.shape
    dst.index_add_(2, ids[part].flatten(), grad.reshape(B, c, -1, d))


def _kv_grad_rows(k: Tensor, ids: Tensor) -> Tensor:
    """Zeroed key and value gradients of ``k[B, c, L, d]`` as one buffer whose first axis :func:`_add_kv_back` indexes:
    ``[L, B, c, 2, d]`` for ids shared by the heads, ``[c, L, B, 2, d]`` (rows head·L + token) for per-head ids.

    ``index_add_`` along dim 0 adds whole contiguous rows (B·c·2d or B·2d elements); along the token axis
    of ``[B, c, L, d]`` it adds strided ``[B, c, d]`` slices, one for keys and one for values: on a 2-core
    EPYC a BigBird chunk's key and value gradients took 3-6x longer that way, copies included.
    """
    B, c, L, d = k.shape
    shape = (L, B, c, 2, d) if ids.dim() == 2 else (c, L, B, 2, d)
    return torch.zeros(shape, dtype=k.dtype, device=k.device)


def _kv_grads(rows: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
    """Key and value gradients ``[B, c, L, d]`` (strided views) of :func:`_kv_grad_rows`' buffer."""
    order = (1, 2, 0, 3) if ids.dim() == 2 else (2, 0, 1, 3)  # [L, B, c, d] or [c, L, B, d] -> [B, c, L, d]
    return tuple(rows[:, :, :, i].permute(order) for i in range(2))


def _add_kv_back(rows: Tensor, d_kg: Optional[Tensor], d_vg: Optional[Tensor], ids: Tensor, heads: Optional[Tensor],
                 part: slice, d_k: Tensor, d_v: Tensor) -> None:
    """Adds the key and value gradients ``d_k, d_v[B, c·m, G + X, d]`` of blocks ``part`` to the rows of
    :func:`_kv_grad_rows`' buffer they were gathered from; the first G (global keys) summed over blocks into
    ``d_kg, d_vg[B, c, G, d]``. ``heads``: the row offsets ``[c, 1, 1]`` of per-head ids (head·L), else None."""
    B, _, _, d = d_k.shape
    if d_kg is not None and d_kg.shape[2]:
        c, G = d_kg.shape[1], d_kg.shape[2]
        d_kg += d_k[:, :, :G].reshape(B, c, -1, G, d).sum(2)
        d_vg += d_v[:, :, :G].reshape(B, c, -1, G, d).sum(2)
        d_k, d_v = d_k[:, :, G:], d_v[:, :, G:]
    c, X = (rows.shape[2] if ids.dim() == 2 else rows.shape[0]), d_k.shape[2]
    if ids.dim() == 2:  # rows [L, B, c, 2, d]: token ids; the chunk's slots as [m, X, B, c, d]
        order, index = (2, 3, 0, 1, 4), ids[part].flatten()
    else:  # rows [c, L, B, 2, d]: (head, token) ids, rows head·L + token; the chunk's slots as [c, m, X, B, d]
        order, index = (1, 2, 3, 0, 4), torch.add(heads, ids[:, part]).view(-1)
    src = torch.stack([t.reshape(B, c, -1, X, d).permute(order) for t in (d_k, d_v)], dim=-2)  # [.., 2, d]: one copy
    rows.view(-1, src.numel() // index.numel()).index_add_(0, index, src.view(index.numel(), -1))


def _slot_row_ids(out_ids: Tensor, slots: int) -> Tensor:
    """For each of ``slots`` block slots: the output row it fills (-1 where none)."""
    rows = torch.full((slots,), -1, dtype=torch.long, device=out_ids.device)
    rows[out_ids] = torch.arange(out_ids.numel(), device=out_ids.device)
    return rows


def _slot_rows(out_ids: Tensor, slots: int) -> tuple[Tensor, Tensor]:
    """For each of ``slots`` block slots: the output row it fills (0 where none) and whether it fills one."""
    rows = _slot_row_ids(out_ids, slots)
    return rows.clamp(min=0), rows >= 0


def _heads_mask(mask: Tensor, part: slice, c: int) -> Tensor:
    """Blocks ``part`` of ``mask`` (``[n, S or 1, K]`` shared or ``[c, n, S or 1, K]``) for c heads:
    ``[1, c·m, S or 1, K]``."""
    mask = mask[part].expand(c, -1, -1, -1) if mask.dim() == 3 else mask[:, part]
    return mask.flatten(0, 1)[None]


def _block_sdpa(q: Tensor, k: Tensor, v: Tensor, k_glob: Optional[Tensor], v_glob: Optional[Tensor], q_ids: Tensor,
                k_ids: Tensor, mask: Tensor, out_ids: Optional[Tensor], scale: float, p_drop: float,
                recompute: bool = False) -> Tensor:
    """:func:`block_attention` through ``F.scaled_dot_product_attention`` (same arguments) -> ``[B, c, L_out, d]``.

    With ``recompute`` each chunk of blocks is checkpointed on its own: backward gathers and recomputes one chunk
    at a time, so that one chunk's gathered keys, values and SDPA buffers are alive at once, not every chunk's.
    """
    B, c, _, d = q.shape
    keys = None if recompute else _KeyRows(k, v, k_glob, v_glob, k_ids)  # a recomputed chunk gathers its own
    outs = []
    for part in _chunks(q, k_ids, FORWARD_SCALE):
        if recompute:
            out = checkpoint(_chunk_sdpa, q, k, v, k_glob, v_glob, q_ids, k_ids, mask, part, scale, p_drop,
                             use_reentrant=False)
        else:
            out = _sdpa_blocks(q, q_ids, keys(part), mask, part, scale, p_drop)
        outs.append(out.view(B, c, -1, d))  # [B, c·m, S, d] -> [B, c, m·S, d]
    out = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]  # [B, c, n·S, d]
    return out if out_ids is None else select_rows(out, out_ids)


def _sdpa_blocks(q: Tensor, q_ids: Tensor, keys: tuple[Tensor, Tensor], mask: Tensor, part: slice, scale: float,
                 p_drop: float) -> Tensor:
    """Blocks ``part``: their queries over their gathered keys and values ``keys`` -> ``[B, c·m, S, d]`` (short key
    lists under bf16/fp16 train with the fp32 backward of :mod:`vitzoo.ops.sdpa`, the mask as an additive bias)."""
    q_part, c = _select(q, q_ids, part), q.shape[1]
    if dispatch.select("sdpa", q_part, *keys, None, p_drop) == "fp32_backward":  # the bias below has no gradient
        return sdpa_ops.fp32_backward_sdpa(q_part, *keys, _heads_bias(mask, part, c, q.dtype), scale=scale)
    mask_part = _heads_mask(mask, part, c)  # [1, c·m, S or 1, K] booleans
    return F.scaled_dot_product_attention(q_part, *keys, attn_mask=mask_part, dropout_p=p_drop, scale=scale)


def _chunk_sdpa(q: Tensor, k: Tensor, v: Tensor, k_glob: Optional[Tensor], v_glob: Optional[Tensor], q_ids: Tensor,
                k_ids: Tensor, mask: Tensor, part: slice, scale: float, p_drop: float) -> Tensor:
    """Blocks ``part`` of :func:`_block_sdpa`, their keys gathered inside (what a checkpoint recomputes)."""
    return _sdpa_blocks(q, q_ids, _KeyRows(k, v, k_glob, v_glob, k_ids)(part), mask, part, scale, p_drop)


def _heads_bias(mask: Tensor, part: slice, c: int, dtype: torch.dtype) -> Tensor:
    """:func:`_heads_mask` as an additive ``[1, c·m, S or 1, K]`` in ``dtype``: 0 where kept, ``-inf`` where masked."""
    keep = _heads_mask(mask, part, c)  # [1, c·m, S or 1, K]
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, float("-inf"))


class _BlockSDPA(torch.autograd.Function):
    """One call of :func:`block_attention` on the CPU flash kernel, saving only its inputs and the log-sum-exp.

    Backward gathers each chunk's blocks again, recomputes their probabilities from the log-sum-exp and
    forms the gradients with matmuls; the output is not kept (``rowsum(dO ⊙ O) = rowsum(P ⊙ dP)``). The
    block gradients are added to the tokens they were gathered from (``index_add``).
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, k_glob: Optional[Tensor], v_glob: Optional[Tensor],
                q_ids: Tensor, k_ids: Tensor, mask: Tensor, out_ids: Optional[Tensor], scale: float) -> Tensor:
        ctx.kernel = dispatch.select("block_function", q, k, v, k_glob, v_glob) == "cpu_kernel"
        ctx.scale = scale
        if ctx.kernel:  # the compiled kernel (one task per image and head)
            out, lse = _kernel_forward(q, k, v, k_glob, v_glob, q_ids, k_ids, mask, out_ids, scale)
            ctx.save_for_backward(q, k, v, k_glob, v_glob, q_ids, k_ids, mask, out_ids, lse)
            return out
        (B, c, _, d), (n, S) = q.shape, q_ids.shape
        out, lse = q.new_empty(B, c, n, S, d), q.new_empty(B, c, n, S)
        keys = _KeyRows(k, v, k_glob, v_glob, k_ids)
        for part in _chunks(q, k_ids, FORWARD_SCALE):
            m = part.stop - part.start
            o, lse_part = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                _select(q, q_ids, part), *keys(part), 0.0, False, attn_mask=_heads_bias(mask, part, c, q.dtype),
                scale=scale)  # [B, c·m, S, d], [B, c·m, S]
            out[:, :, part] = o.view(B, c, m, S, d)
            lse[:, :, part] = lse_part.view(B, c, m, S)
        ctx.save_for_backward(q, k, v, k_glob, v_glob, q_ids, k_ids, mask, out_ids, lse)
        out = out.view(B, c, n * S, d)
        return out if out_ids is None else select_rows(out, out_ids)  # [B, c, L_out, d]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
        if ctx.kernel:
            return _kernel_backward(ctx, grad)
        q, k, v, k_glob, v_glob, q_ids, k_ids, mask, out_ids, lse = ctx.saved_tensors
        (B, c, _, d), (n, S) = q.shape, q_ids.shape
        grad = grad.to(q.dtype)
        rows, filled = (None, None) if out_ids is None else _slot_rows(out_ids, n * S)
        d_q = torch.zeros(q.shape, dtype=q.dtype, device=q.device)  # contiguous
        d_kv = _kv_grad_rows(k, k_ids)  # key|value gradients, rows of the tokens (per head: of (head, token))
        d_kg, d_vg = (None, None) if k_glob is None else (torch.zeros_like(k_glob), torch.zeros_like(v_glob))
        keys = _KeyRows(k, v, k_glob, v_glob, k_ids)
        heads = None if k_ids.dim() == 2 else _head_offsets(k_ids, (c, k.shape[2]))  # [c, 1, 1]: head·L
        for part in _chunks(q, k_ids):
            m = part.stop - part.start
            slots = slice(part.start * S, part.stop * S)
            if rows is None:  # outputs in block order
                g_o = grad[:, :, slots]
            else:  # output rows of the chunk's slots; slots without one get no gradient
                g_o = grad.index_select(2, rows[slots]).mul_(filled[slots, None])
            g_o = g_o.reshape(B * c * m, S, d)
            q_s, (k_s, v_s) = _select(q, q_ids, part).view(-1, S, d), keys(part)  # [B·c·m, S, d], [B, c·m, G + K, d]
            k_s, v_s = k_s.view(B * c * m, -1, d), v_s.view(B * c * m, -1, d)
            p = torch.bmm(q_s, k_s.transpose(1, 2)).mul_(ctx.scale * LOG2E)  # scores in log2 units (LOG2E)
            p5 = p.view(B, c, m, S, -1)  # probabilities, recomputed: [B, c, m, S, G + K]
            p5.sub_(lse[:, :, part, :, None], alpha=LOG2E).clamp_max_(0.0).exp2_()  # ≤ 1 where masked too
            p5.mul_(mask[..., part, :, :].to(p.dtype))  # masked slots: 0 (4x faster than masked_fill_ broadcast)
            d_v_s = torch.bmm(p.transpose(1, 2), g_o)  # dV = Pᵀ dO [B·c·m, G + K, d]
            d_s = torch.bmm(g_o, v_s.transpose(1, 2)).mul_(p)  # P ⊙ dP, dP = dO Vᵀ
            del g_o, v_s
            d_s.addcmul_(p, d_s.sum(-1, keepdim=True), value=-1).mul_(ctx.scale)  # dS = P ⊙ (dP - rowsum(P ⊙ dP))
            del p, p5
            _add_query_back(d_q, q_ids, part, torch.bmm(d_s, k_s))  # dQ = dS K·scale
            del k_s
            d_k_s = torch.bmm(d_s.transpose(1, 2), q_s)  # dK = dSᵀ Q·scale
            del d_s, q_s
            d_k_s, d_v_s = d_k_s.view(B, c * m, -1, d), d_v_s.view(B, c * m, -1, d)
            _add_kv_back(d_kv, d_kg, d_vg, k_ids, heads, part, d_k_s, d_v_s)
            del d_k_s, d_v_s  # before the next chunk is gathered
        d_k, d_v = _kv_grads(d_kv, k_ids)
        return d_q, d_k, d_v, d_kg, d_vg, None, None, None, None, None


def _kernel_args(q: Tensor, k: Tensor, v: Tensor, k_glob: Optional[Tensor], v_glob: Optional[Tensor], q_ids: Tensor,
                 k_ids: Tensor, mask: Tensor) -> tuple[Tensor, ...]:
    """:class:`_BlockSDPA`'s inputs as :func:`vitzoo.cpu_kernels.block_kernel.forward` takes them (empty global
    keys for None, ids ``[c or 1, n, K]``, the mask in the kernel's byte layout)."""
    B, c, _, d = q.shape
    empty = q.new_zeros(B, c, 0, d)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))  # rows of d contiguous elements
    k_glob, v_glob = (t if t is None or t.stride(-1) == 1 else t.contiguous() for t in (k_glob, v_glob))
    q_ids, k_ids = q_ids.contiguous(), (k_ids if k_ids.dim() == 3 else k_ids[None]).contiguous()
    keep = block_kernel.keep_layout(mask, q_ids.shape[1])
    return q, k, v, empty if k_glob is None else k_glob, empty if v_glob is None else v_glob, q_ids, k_ids, keep


def _kernel_forward(q: Tensor, k: Tensor, v: Tensor, k_glob: Optional[Tensor], v_glob: Optional[Tensor], q_ids: Tensor,
                    k_ids: Tensor, mask: Tensor, out_ids: Optional[Tensor], scale: float) -> tuple[Tensor, Tensor]:
    """:func:`block_attention` through the compiled kernel (same arguments): the output ``[B, c, L_out, d]`` and
    the log-sum-exp ``[B, c, n, S]``."""
    (B, c, _, d), (n, S) = q.shape, q_ids.shape
    out, lse = block_kernel.forward(*_kernel_args(q, k, v, k_glob, v_glob, q_ids, k_ids, mask), scale)
    out = out.view(B, c, n * S, d)
    return (out if out_ids is None else select_rows(out, out_ids)), lse


def _kernel_backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
    """:class:`_BlockSDPA`'s backward through the compiled kernel, which reads the output gradient's row of each
    block slot (zero for slots without one)."""
    q, k, v, k_glob, v_glob, q_ids, k_ids, mask, out_ids, lse = ctx.saved_tensors
    rows = None if out_ids is None else _slot_row_ids(out_ids, q_ids.numel())
    # the mask's byte layout is rebuilt (0.8 ms for BigBird's per-head mask at 4,096 tokens): saved from the
    # forward it would add 1.7 MB to the live peak
    args = _kernel_args(q, k, v, k_glob, v_glob, q_ids, k_ids, mask)
    d_q, d_k, d_v, d_kg, d_vg = block_kernel.backward(*args, ctx.scale, lse, grad.to(q.dtype), rows)
    glob = (None, None) if k_glob is None else (d_kg, d_vg)
    return d_q, d_k, d_v, *glob, None, None, None, None, None
