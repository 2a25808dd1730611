"""The training path of window attention: ``softmax(QKᵀ/√d + bias + mask)V`` per window in one autograd node.

SDPA with the learned relative position bias as its mask takes the math kernel on the CPU (only it
gives the mask a gradient), which stores the ``[B·nW, h, T, T]`` probabilities and contiguous copies of
q, k and v. :class:`WindowCore` takes the fused projection ``qkv[B, N, 3C]`` of the tokens in their order
(so the projection saves its input, not a partitioned copy) and the window index, and returns merged heads
``[B, N, C]`` in token order (what the output projection takes); it saves only ``qkv``, the bias and the
log-sum-exp ``[B·nW, h, T]``, recomputes the probabilities in backward (windows no longer than a head is wide
keep them instead: :func:`_keeps_probs`) and adds the q/k/v gradients into one ``[B, N, 3C]`` buffer. Scores and log-sum-exp are in log2 units: ``exp2`` is the fast exponential
(:data:`~vitzoo.attention.base.LOG2E`). Both passes work through blocks of windows whose scores stay cache-sized
(:data:`SCORE_ELEMENTS`). Autocast is off inside: the matmuls take q, k, v in
their dtype (bfloat16 under autocast, as timm's Swin computes them), scores, probabilities and the
log-sum-exp are float32 (float64 stays float64); gradients come back in the inputs' dtypes.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from vitzoo.attention.base import LOG2E, tracing


def core_applies(qkv: Tensor, p_drop: float) -> bool:
    """:class:`WindowCore` runs the step: training on the CPU without attention dropout, eager (not traced
    or compiled, where the plain SDPA expression is kept)."""
    return (torch.is_grad_enabled() and qkv.requires_grad and qkv.device.type == "cpu" and p_drop == 0.0
            and not tracing())


# Scores per block of windows and CPU thread (1 MB in float32): the block's scores, probabilities and
# their gradients stay in cache. Backward takes half as many windows per block (it holds q, k, v, dO and two
# score tensors): the layer's live peak (64x64 tokens, 8x8 windows) is 85 MB, 89 MB with full blocks.
# Much smaller blocks (1 << 16) made a swin_cifar training step 5-15% slower (4x4 windows).
SCORE_ELEMENTS = 1 << 18


def _blocks(R: int, per_window: int) -> list[slice]:
    """Window ranges of about :data:`SCORE_ELEMENTS` scores per thread (``per_window`` = h·T² each)."""
    step = max(1, SCORE_ELEMENTS * max(1, torch.get_num_threads()) // per_window)
    return [slice(i, min(i + step, R)) for i in range(0, R, step)]


def _heads(t: Tensor) -> Tensor:
    """``t[r, T, h, d]`` (a strided view) -> contiguous ``[r·h, T, d]``: one copy."""
    r, T, h, d = t.shape
    return t.transpose(1, 2).reshape(r * h, T, d)


def _gather_heads(flat: Tensor, rows: Tensor, r: int, heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v ``[r·h, T, d]`` of the slots reading rows ``rows[r·T]`` of ``flat[B·N, 3C]`` (one gathered copy,
    freed on return, then one copy each)."""
    parts = flat.index_select(0, rows).view(r, -1, 3, heads, flat.shape[1] // (3 * heads))  # [r, T, 3, h, d]
    return tuple(_heads(parts[:, :, i]) for i in range(3))


def _put(dst: Tensor, src: Tensor) -> None:
    """Writes heads ``src[r·h, T, d]`` into the merged-heads view ``dst[r, T, h, d]`` (casting to its dtype)."""
    r, T, h, d = dst.shape
    dst.copy_(src.view(r, h, T, d).transpose(1, 2))


def _slot_rows(index: Tensor, images: int, tokens: int, prefix: int) -> tuple[Tensor, Tensor]:
    """Where the slots of the ``B·nW`` windows (rows ``b·nW + w``) read and write in the flattened tokens ``[B·N, ·]``.

    Returns:
        ``read[B·nW, T]``: the row each slot reads (padding: its image's token 0); ``write[B·nW, T]``: the row
        its output goes to (prefix and padding slots: the spare row ``B·N``).
    """
    offset = torch.arange(images, device=index.device)[:, None, None] * tokens  # [B, 1, 1]
    read = (offset + index.clamp(min=0)).flatten(0, 1)
    return read, torch.where((index >= prefix).repeat(images, 1), read, images * tokens)


def _copy_rows(dst: Tensor, rows: Tensor, src: Tensor) -> None:
    """``dst[rows] = src`` for contiguous ``dst[n, k]`` and ``src[m, k]``; rows a whole number of 16 bytes long
    are copied as complex128 elements (index_copy_ goes element by element: 2-4x faster on the CPU)."""
    if dst.shape[1] * dst.element_size() % 16 == 0:
        dst, src = dst.view(torch.complex128), src.view(torch.complex128)
    dst.index_copy_(0, rows, src)


def _images(windows: slice, nw: int) -> Tensor:
    """The image of each row ``b·nW + w`` in ``windows``."""
    return torch.arange(windows.start, windows.stop) // nw


def _grad_weights(index: Tensor, prefix: int, dtype: torch.dtype) -> Tensor:
    """``[nW, T]`` share of each slot in its token's output: 1, 1/nW for the P prefix slots (the output is the
    mean over the windows), 0 for padding (dropped)."""
    weight = (index >= 0).to(dtype)
    weight[:, :prefix] = 1 / index.shape[0]
    return weight


def _scores(q: Tensor, k: Tensor, bias: Tensor, mask: Optional[Tensor], windows: slice, scale: float,
            dtype: torch.dtype, out: Optional[Tensor] = None) -> Tensor:
    """``(QKᵀ·scale + bias (+ mask))·log2 e`` ``[r·h, T, T]`` in ``dtype`` of windows ``windows`` (rows
    ``b·nW + w``: mask ``w``): the scores in log2 units, for ``exp2`` (:data:`~vitzoo.attention.base.LOG2E`);
    into ``out`` if given."""
    r, (h, T, _) = windows.stop - windows.start, bias.shape
    s = q.new_empty(r, h, T, T, dtype=dtype) if out is None else out.view(r, h, T, T)  # QKᵀ is accumulated into it
    if mask is None:
        torch.mul(bias.expand(r, h, T, T), LOG2E, out=s)
    else:
        rows = torch.arange(windows.start, windows.stop, device=mask.device) % mask.shape[0]  # window of each row
        torch.add(bias, mask.index_select(0, rows)[:, None], out=s).mul_(LOG2E)
    s = s.view(r * h, T, T)
    if q.dtype == dtype:
        return s.baddbmm_(q, k.transpose(1, 2), alpha=scale * LOG2E)  # QKᵀ: T·T·d per window and head
    return s.add_(torch.bmm(q, k.transpose(1, 2)), alpha=scale * LOG2E)  # bfloat16/half QKᵀ, float32 scores


def _softmax_(s: Tensor, lse: Optional[Tensor]) -> Tensor:
    """Softmax of scores ``s[.., T]`` in log2 units (:func:`_scores`), in place; their log-sum-exp (log2 units)
    into ``lse[.., 1]`` unless None."""
    top = s.amax(-1, keepdim=True)
    p = s.sub_(top).exp2_()
    total = p.sum(-1, keepdim=True)
    if lse is not None:
        torch.add(top, total.log2(), out=lse)
    return p.div_(total)


def _keeps_probs(T: int, head_dim: int) -> bool:
    """Forward keeps the probabilities for backward when a window is no longer than a head is wide (T ≤ d: the
    ``[T, T]`` probabilities of a window and head take no more memory than its queries ``[T, d]``); otherwise it
    keeps the log-sum-exp and backward recomputes them. On a 2-core AMD EPYC (Zen 2) the core of a ``swin_cifar``
    window layer (T = 16, d = 32) trained 1.15x faster this way, the whole step 1.025x; 8x8 windows (T = 64) would
    keep twice the queries' size."""
    return T <= head_dim


class WindowCore(torch.autograd.Function):
    """``qkv[B, N, 3C]`` (tokens in order; q|k|v side by side, heads inside each), ``index[nW, T]`` (the token
    each window slot reads: the P prefix tokens first, then grid tokens or -1 for padding; constant), ``prefix``
    (P), ``bias[h, T, T]``, ``mask[nW, T, T]`` or None (window ``r % nW`` of row r; constant; it must mask padding
    slots as keys) -> merged heads ``[B, N, C]`` in token order (a prefix token gets the mean of its outputs over
    the windows), with the bias' gradient. Each block of windows gathers its q|k|v rows (again in backward) and
    copies its outputs (q/k/v gradients) into the token rows; prefix slots are summed per image."""

    @staticmethod
    def forward(ctx: Any, qkv: Tensor, index: Tensor, prefix: int, bias: Tensor, mask: Optional[Tensor], heads: int,
                scale: float) -> Tensor:
        B, N, C3 = qkv.shape
        nw, T = index.shape
        dtype = torch.float64 if qkv.dtype == torch.float64 else torch.float32
        flat = qkv.view(B * N, C3)
        out = qkv.new_empty(B * N + 1, C3 // 3)  # the last row takes the prefix and padding slots' outputs
        prefix_sum = qkv.new_zeros(B, prefix, C3 // 3)
        keep = _keeps_probs(T, C3 // (3 * heads))
        stats = torch.empty(B * nw * heads, T, T if keep else 1, dtype=dtype, device=qkv.device)  # probs or lse
        read, write = _slot_rows(index, B, N, prefix)
        with torch.autocast(qkv.device.type, enabled=False):
            for win in _blocks(B * nw, heads * T * T):
                q, k, v = _gather_heads(flat, read[win].flatten(), win.stop - win.start, heads)  # [r·h, T, d]
                rows = stats[win.start * heads:win.stop * heads]
                s = _scores(q, k, bias, mask, win, scale, dtype, rows if keep else None)
                p = _softmax_(s, None if keep else rows)
                o = torch.bmm(p.to(v.dtype), v)  # AV: T·T·d
                o = o.view(-1, heads, T, o.shape[-1]).transpose(1, 2).reshape(-1, T, C3 // 3)  # [r, T, C]
                _copy_rows(out, write[win].flatten(), o.view(-1, C3 // 3))
                if prefix:
                    prefix_sum.index_add_(0, _images(win, nw), o[:, :prefix])
        ctx.save_for_backward(qkv, index, bias, mask, stats)
        ctx.prefix, ctx.heads, ctx.scale, ctx.keep = prefix, heads, scale, keep
        tokens = out[:B * N].view(B, N, C3 // 3)
        tokens[:, :prefix] = prefix_sum / nw
        return tokens

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
        qkv, index, bias, mask, stats = ctx.saved_tensors
        B, N, C3 = qkv.shape
        nw, T = index.shape
        flat, weight = qkv.view(B * N, C3), _grad_weights(index, ctx.prefix, grad.dtype).repeat(B, 1)
        read, write = _slot_rows(index, B, N, ctx.prefix)
        grad = grad.reshape(B * N, C3 // 3)
        d_qkv = qkv.new_empty(B * N + 1, C3)  # the last row takes the prefix and padding slots' gradients
        d_prefix = qkv.new_zeros(B, ctx.prefix, C3)
        d_bias = torch.zeros(bias.shape, dtype=stats.dtype, device=bias.device)
        with torch.autocast(qkv.device.type, enabled=False):
            for win in _blocks(B * nw, 2 * ctx.heads * T * T):  # half the forward's windows: a lower peak
                d_parts = _block_backward(flat, grad, read[win].flatten(), weight[win], win, bias, mask, stats,
                                          ctx.keep, ctx.heads, ctx.scale, d_bias)  # [r, T, 3C]
                _copy_rows(d_qkv, write[win].flatten(), d_parts.view(-1, C3))
                if ctx.prefix:
                    d_prefix.index_add_(0, _images(win, nw), d_parts[:, :ctx.prefix])
                del d_parts  # before the next block's temporaries
        d_tokens = d_qkv[:B * N].view(B, N, C3)
        d_tokens[:, :ctx.prefix] = d_prefix
        return d_tokens, None, None, d_bias.to(bias.dtype), None, None, None


def _block_backward(flat: Tensor, grad: Tensor, read: Tensor, weight: Tensor, win: slice, bias: Tensor,
                    mask: Optional[Tensor], stats: Tensor, kept: bool, heads: int, scale: float,
                    d_bias: Tensor) -> Tensor:
    """The q|k|v gradients ``[r, T, 3C]`` of the slots of windows ``win`` (adds the bias gradient to ``d_bias``).

    Args:
        flat: ``qkv[B·N, 3C]``. grad: output gradient ``[B·N, C]``. read: :func:`_slot_rows`' read rows ``[r·T]``.
        weight: the slots' :func:`_grad_weights` ``[r, T]``. bias, mask, heads, scale: as in forward.
        stats: the forward's probabilities ``[B·nW·h, T, T]`` (``kept``) or log-sum-exp ``[B·nW·h, T, 1]``.
    """
    (r, T), C3 = weight.shape, flat.shape[1]
    q, k, v = _gather_heads(flat, read, r, heads)  # [r·h, T, d]
    d_o = _heads(grad.index_select(0, read).view(r, T, heads, -1).mul_(weight[:, :, None, None]))
    rows = stats[win.start * heads:win.stop * heads]
    p = rows if kept else _scores(q, k, bias, mask, win, scale, stats.dtype).sub_(rows).exp2_()  # probabilities
    d_s = torch.bmm(d_o, v.transpose(1, 2)).to(p.dtype).mul_(p)  # P ⊙ dP, dP = dO Vᵀ
    del v
    d_v = torch.bmm(p.to(d_o.dtype).transpose(1, 2), d_o)  # dV = Pᵀ dO
    del d_o
    d_s.addcmul_(p, d_s.sum(-1, keepdim=True), value=-1)  # dS = P ⊙ (dP - rowsum(P ⊙ dP))
    del p
    d_bias += d_s.view(-1, heads, T, T).sum(0)
    d_s = d_s.mul_(scale).to(q.dtype)
    d_parts = flat.new_empty(r, T, 3, heads, C3 // (3 * heads))
    _put(d_parts[:, :, 2], d_v)
    del d_v
    _put(d_parts[:, :, 0], torch.bmm(d_s, k))  # dQ = dS K·scale
    _put(d_parts[:, :, 1], torch.bmm(d_s.transpose(1, 2), q))  # dK = dSᵀ Q·scale
    return d_parts.view(r, T, C3)
