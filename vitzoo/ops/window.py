"""Window attention on the CPU: ``softmax(QKᵀ/√d + bias + mask)V`` per window in one autograd node (training),
or the same forward keeping nothing (inference of enough windows: ``window_attention`` in
:mod:`vitzoo.ops.dispatch`).

SDPA with the learned relative position bias as its mask takes the math kernel on the CPU (only it
gives the mask a gradient), which stores the ``[B·nW, h, T, T]`` probabilities and contiguous copies of
q, k and v. :class:`WindowCore` takes the fused projection ``qkv[B, N, 3C]`` of the tokens in their order
(so the projection saves its input, not a partitioned copy) and the window index, and returns merged heads
``[B, N, C]`` in token order (what the output projection takes). Forward copies each window's q, k and v heads
into one ``[3, B·nW·h, T, d]`` buffer, the same size as ``qkv``, and saves it in place of ``qkv`` (backward reads
them without a second gather), with the bias and the log-sum-exp ``[B·nW, h, T]``; it recomputes the
probabilities in backward (windows no longer than a head is wide keep them instead: :func:`keeps_probs`) and
adds the q/k/v gradients into one ``[B, N, 3C]`` buffer. Windows that just tile the grid (no shift, padding or
prefix) are read and written through strided views (:class:`_GridSlots`), the others through their rows
(:class:`_GatheredSlots`). Scores and log-sum-exp are in log2 units: ``exp2`` is the fast exponential
(:data:`~vitzoo.ops.common.LOG2E`). Both passes work through blocks of windows whose scores stay cache-sized
(:data:`SCORE_ELEMENTS`). Autocast is off inside: the matmuls take q, k, v in
their dtype (bfloat16 under autocast, as timm's Swin computes them), scores, probabilities and the
log-sum-exp are float32 (float64 stays float64); gradients come back in the inputs' dtypes.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch import Tensor

from vitzoo.ops.common import LOG2E

# Inference runs the core from this many windows × heads per call (B·nW·h) on: below it the core's fixed cost
# (about 0.25 ms a call on a 2-core AMD EPYC, Zen 2: strided copies and a few more ops) outweighs what it saves,
# and SDPA's fused CPU kernel, which reads q/k/v in place, is faster. swin_cifar, core time / SDPA time per layer:
# about 1.55 at 32-64 window-heads, 1.09 at 512, 0.98-1.01 at 1,024, 0.96 at 2,048 (stage 2, one unmasked window
# per image: 0.91 at 256, 0.85 at 512).
INFER_MIN_WINDOW_HEADS = 1024


# Scores per block of windows and CPU thread (1 MB in float32): the block's scores, probabilities and
# their gradients stay in cache. Backward takes half as many windows per block (it holds q, k, v, dO and two
# score tensors): the layer's live peak (64x64 tokens, 8x8 windows) is 85 MB, 89 MB with full blocks.
# Much smaller blocks (1 << 16) made a swin_cifar training step 5-15% slower (4x4 windows).
SCORE_ELEMENTS = 1 << 18


def _blocks(R: int, per_window: int, align: int = 1) -> list[slice]:
    """Window ranges of about :data:`SCORE_ELEMENTS` scores per thread (``per_window`` = h·T² each), each a
    multiple of ``align`` windows (``R`` is one)."""
    step = max(1, SCORE_ELEMENTS * max(1, torch.get_num_threads()) // per_window)
    step = max(align, step // align * align)
    return [slice(i, min(i + step, R)) for i in range(0, R, step)]


def _heads(t: Tensor) -> Tensor:
    """``t[r, T, h, d]`` (a strided view) -> contiguous ``[r·h, T, d]``: one copy."""
    r, T, h, d = t.shape
    return t.transpose(1, 2).reshape(r * h, T, d)


def _slot_rows(index: Tensor, images: int, tokens: int, prefix: int) -> tuple[Tensor, Tensor]:
    """Where the slots of the ``B·nW`` windows (rows ``b·nW + w``) read and write in the flattened tokens ``[B·N, ·]``.

    Returns:
        ``read[B·nW, T]``: the row each slot reads (padding: its image's token 0); ``write[B·nW, T]``: the row
        its output goes to (prefix and padding slots: the spare row ``B·N``).
    """
    offset = torch.arange(images, device=index.device)[:, None, None] * tokens  # [B, 1, 1]
    read = (offset + index.clamp(min=0)).flatten(0, 1)
    return read, torch.where((index >= prefix).repeat(images, 1), read, images * tokens)


def _put_rows(dst: Tensor, rows: Tensor, src: Tensor) -> None:
    """``dst[rows] = src`` for ``dst[n, h, d]`` (a view of token rows), ``rows[r, T]`` and ``src[r, T, h, d]`` (a view
    of heads), cast to ``dst``'s dtype; heads a whole number of 16 bytes wide are copied as complex128 elements
    (1.5x faster than float32 elements on the CPU)."""
    src = src.to(dst.dtype)
    if dst.shape[-1] * dst.element_size() % 16 == 0:
        dst, src = dst.view(torch.complex128), src.view(torch.complex128)
    dst.index_put_((rows,), src)


def _grad_weights(index: Tensor, prefix: int, dtype: torch.dtype) -> Tensor:
    """``[nW, T]`` share of each slot in its token's output: 1, 1/nW for the P prefix slots (the output is the
    mean over the windows), 0 for padding (dropped)."""
    weight = (index >= 0).to(dtype)
    weight[:, :prefix] = 1 / index.shape[0]
    return weight


class _GatheredSlots:
    """Windows read through ``index[nW, T]`` (the token of each slot: P prefix tokens, then grid tokens or -1 for
    padding): each block of windows gathers its rows of the tokens ``[B, N, ·]`` and copies its outputs into
    them; the prefix slots' outputs are summed per image, padding slots' dropped.

    Args:
        index: ``[nW, T]``. prefix: P. images, tokens: B, N.
    """

    def __init__(self, index: Tensor, prefix: int, images: int, tokens: int):
        self.index, self.prefix, self.images, self.tokens = index, prefix, images, tokens
        self.read_rows, self.write_rows = _slot_rows(index, images, tokens, prefix)  # [B·nW, T] each
        self.weight: Optional[Tensor] = None  # the slots' gradient shares [B·nW, T] (None: all 1), set by read_grad
        self._weighed = False  # read_grad has decided on weight (once per call, not per block)

    def blocks(self, per_window: int) -> list[slice]:
        return _blocks(self.read_rows.shape[0], per_window)

    def _rows(self, x: Tensor, win: slice) -> Tensor:
        """The slots' rows of ``x[B, N, width]`` as ``[r, T, width]`` (one gathered copy)."""
        rows = x.view(-1, x.shape[-1]).index_select(0, self.read_rows[win].flatten())
        return rows.view(win.stop - win.start, -1, x.shape[-1])

    def read_parts(self, x: Tensor, win: slice, heads: int, dst: Tensor) -> None:
        """Copies the heads of the k parts side by side in ``x[B, N, k·h·d]`` (q|k|v) into ``dst[k, r·h, T, d]``."""
        rows = self._rows(x, win)
        rows = rows.view(*rows.shape[:2], dst.shape[0], heads, -1)  # [r, T, k, h, d]
        for i, part in enumerate(dst):  # a copy per part: 1.5x faster than one copy of all
            part.view(-1, heads, *part.shape[1:]).copy_(rows[:, :, i].transpose(1, 2))

    def read_grad(self, grad: Tensor, win: slice, heads: int) -> Tensor:
        """Heads ``[r·h, T, d]`` of the output gradient ``grad[B, N, h·d]`` at the slots, times each slot's share
        (:func:`_grad_weights`): padding slots get 0, prefix slots 1/nW."""
        rows = self._rows(grad, win)
        rows = rows.view(*rows.shape[:2], heads, -1)  # [r, T, h, d]
        if not self._weighed:
            if self.prefix or bool(self.index.min() < 0):
                self.weight = _grad_weights(self.index, self.prefix, rows.dtype).repeat(self.images, 1)
            self._weighed = True
        if self.weight is not None:
            rows.mul_(self.weight[win, :, None, None])
        return _heads(rows)

    def output(self, like: Tensor, width: int) -> tuple[Tensor, Tensor]:
        """Empty token rows ``[B·N + 1, width]`` (the last takes prefix and padding slots) and the prefix sums
        ``[B, P, width]``."""
        return like.new_empty(self.images * self.tokens + 1, width), like.new_zeros(self.images, self.prefix, width)

    def write(self, out: Tensor, prefix_sum: Tensor, win: slice, parts: list[Tensor], heads: int) -> None:
        """Copies the heads ``[r·h, T, d]`` of ``parts`` (side by side) into the slots' rows of ``out``."""
        r, T, P = win.stop - win.start, self.read_rows.shape[1], self.prefix
        rows = out.view(out.shape[0], len(parts), heads, -1)  # [B·N + 1, k, h, d]
        sums = prefix_sum.view(self.images, P, *rows.shape[1:])  # [B, P, k, h, d]
        images = torch.arange(win.start, win.stop) // self.index.shape[0] if P else None  # the image of each window
        for i, part in enumerate(parts):
            part = part.view(r, heads, T, -1).transpose(1, 2)  # [r, T, h, d]
            _put_rows(rows[:, i], self.write_rows[win], part)
            if P:
                sums[:, :, i].index_add_(0, images, part[:, :P].to(sums.dtype))

    def tokens_of(self, out: Tensor, prefix_sum: Tensor, mean: bool) -> Tensor:
        """``[B, N, width]``: the token rows of ``out``, the prefix tokens' rows their sums over the windows (the
        mean if ``mean``)."""
        tokens = out[:self.images * self.tokens].view(self.images, self.tokens, -1)
        if self.prefix:
            tokens[:, :self.prefix] = prefix_sum / self.index.shape[0] if mean else prefix_sum
        return tokens


class _GridSlots:
    """Windows that tile a grid of tokens, ``partition`` = (H, W, M): no shift, padding or prefix. Slots are read
    and outputs written through strided views of the tokens ``[B, H·W, ·]``, without gathered copies; blocks hold
    whole rows of windows.

    Args:
        partition: (H, W, M). images: B.
    """

    def __init__(self, partition: tuple[int, int, int], images: int):
        H, W, self.M = partition
        self.images, self.tokens = images, H * W
        self.strips, self.align = images * H // self.M, W // self.M  # rows of windows, windows per row

    def blocks(self, per_window: int) -> list[slice]:
        return _blocks(self.strips * self.align, per_window, self.align)

    def _windows(self, x: Tensor, win: slice, heads: int, parts: int) -> Tensor:
        """``x[B, H·W, parts·h·d]`` -> the strided view ``[s, W/M, parts, h, M, M, d]`` of the windows ``win``."""
        M, d = self.M, x.shape[-1] // (parts * heads)
        x = x.view(self.strips, M, self.align, M, parts, heads, d)[win.start // self.align:win.stop // self.align]
        return x.permute(0, 2, 4, 5, 1, 3, 6)  # [s, W/M, parts, h, M, M, d]

    def read_parts(self, x: Tensor, win: slice, heads: int, dst: Tensor) -> None:
        """Copies the heads of the k parts side by side in ``x[B, N, k·h·d]`` (q|k|v) into ``dst[k, r·h, T, d]``."""
        view = self._windows(x, win, heads, dst.shape[0])  # [s, W/M, k, h, M, M, d]
        for i, part in enumerate(dst):  # a copy per part: 1.5x faster than one copy of all
            part.view(view[:, :, i].shape).copy_(view[:, :, i])

    def read_grad(self, grad: Tensor, win: slice, heads: int) -> Tensor:
        """Heads ``[r·h, T, d]`` of the output gradient ``grad[B, N, h·d]`` (every slot's share is 1)."""
        d_o = grad.new_empty(1, (win.stop - win.start) * heads, self.M * self.M, grad.shape[-1] // heads)
        self.read_parts(grad, win, heads, d_o)
        return d_o[0]

    def output(self, like: Tensor, width: int) -> tuple[Tensor, None]:
        """Empty tokens ``[B, N, width]`` (no prefix sums)."""
        return like.new_empty(self.images, self.tokens, width), None

    def write(self, out: Tensor, prefix_sum: None, win: slice, parts: list[Tensor], heads: int) -> None:
        """Copies the heads ``[r·h, T, d]`` of ``parts`` (side by side) into the windows' tokens of ``out``."""
        view = self._windows(out, win, heads, len(parts))
        for i, part in enumerate(parts):
            view[:, :, i].copy_(part.view(view[:, :, i].shape))

    def tokens_of(self, out: Tensor, prefix_sum: None, mean: bool) -> Tensor:
        return out


def _score_base(bias: Tensor, mask: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    """``(bias + mask)·log2 e`` ``[nW, h, T, T]`` (``[1, h, T, T]`` without a mask) in ``dtype``: what the scores of
    window ``w`` start from."""
    base = bias[None] if mask is None else bias + mask[:, None]  # [nW or 1, h, T, T]
    return base.to(dtype) * LOG2E


def _scores(q: Tensor, k: Tensor, base: Tensor, windows: slice, scale: float, out: Optional[Tensor] = None) -> Tensor:
    """``(QKᵀ·scale + bias (+ mask))·log2 e`` ``[r·h, T, T]`` of windows ``windows`` (rows ``b·nW + w`` start from
    ``base[w % len(base)]``, :func:`_score_base`): the scores in log2 units, for ``exp2``
    (:data:`~vitzoo.ops.common.LOG2E`); into ``out`` if given."""
    r, (nb, h, T, _) = windows.stop - windows.start, base.shape
    s = q.new_empty(r, h, T, T, dtype=base.dtype) if out is None else out.view(r, h, T, T)  # QKᵀ is added to it
    if windows.start % nb == 0 and r % nb == 0:  # whole images: broadcast
        s.view(r // nb, nb, h, T, T).copy_(base)
    else:
        torch.index_select(base, 0, torch.arange(windows.start, windows.stop, device=base.device) % nb, out=s)
    s = s.view(r * h, T, T)
    if q.dtype == s.dtype:
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


def keeps_probs(T: int, head_dim: int) -> bool:
    """Forward keeps the probabilities for backward when a window is no longer than a head is wide (T ≤ d: the
    ``[T, T]`` probabilities of a window and head take no more memory than its queries ``[T, d]``); otherwise it
    keeps the log-sum-exp and backward recomputes them. On a 2-core AMD EPYC (Zen 2) the core of a ``swin_cifar``
    window layer (T = 16, d = 32) trained 1.15x faster this way, the whole step 1.025x; 8x8 windows (T = 64) would
    keep twice the queries' size."""
    return T <= head_dim


_Slots = Union[_GatheredSlots, _GridSlots]


def _slots(qkv: Tensor, index: Tensor, prefix: int, partition: Optional[tuple[int, int, int]]) -> _Slots:
    """:class:`_GridSlots` for a plain ``partition``, else :class:`_GatheredSlots` of ``index``."""
    return _GridSlots(partition, qkv.shape[0]) if partition else _GatheredSlots(index, prefix, *qkv.shape[:2])


def _score_dtype(qkv: Tensor) -> torch.dtype:
    """Scores, probabilities and log-sum-exp are float32 (float64 for float64 inputs)."""
    return torch.float64 if qkv.dtype == torch.float64 else torch.float32


def _attend(qkv: Tensor, slots: _Slots, base: Tensor, heads: int, scale: float, q_k_v: Optional[Tensor] = None,
            stats: Optional[Tensor] = None, keep: bool = False) -> Tensor:
    """The windows' attention block by block: ``qkv[B, N, 3C]`` -> merged heads ``[B, N, C]`` in token order.

    Args:
        slots: where the windows read and write (:func:`_slots`). base: :func:`_score_base`. heads, scale: h, 1/√d.
        q_k_v: ``[3, B·nW·h, T, d]`` to keep the windows' heads in, or None (each block's are temporary).
        stats: ``[B·nW·h, T, T]`` for the probabilities (``keep``) or ``[B·nW·h, T, 1]`` for the log-sum-exp, or None.
    """
    C, T = qkv.shape[-1] // 3, base.shape[-1]
    out, prefix_sum = slots.output(qkv, C)
    with torch.autocast(qkv.device.type, enabled=False):
        for win in slots.blocks(heads * T * T):
            rows = slice(win.start * heads, win.stop * heads)
            parts = qkv.new_empty(3, rows.stop - rows.start, T, C // heads) if q_k_v is None else q_k_v[:, rows]
            slots.read_parts(qkv, win, heads, parts)
            q, k, v = parts  # [r·h, T, d]
            stat = None if stats is None else stats[rows]
            p = _softmax_(_scores(q, k, base, win, scale, stat if keep else None), None if keep else stat)
            slots.write(out, prefix_sum, win, [torch.bmm(p.to(v.dtype), v)], heads)  # AV: T·T·d
    return slots.tokens_of(out, prefix_sum, mean=True)


def window_core(qkv: Tensor, index: Tensor, prefix: int, bias: Tensor, mask: Optional[Tensor], heads: int,
                scale: float, partition: Optional[tuple[int, int, int]] = None) -> Tensor:
    """Window attention on the CPU (``cpu_core`` of :mod:`vitzoo.ops.dispatch`): :class:`WindowCore` when a
    gradient is needed, else its forward without keeping anything. Arguments and result as :class:`WindowCore`'s."""
    if torch.is_grad_enabled() and (qkv.requires_grad or bias.requires_grad):
        return WindowCore.apply(qkv, index, prefix, bias, mask, heads, scale, partition)
    base = _score_base(bias, mask, _score_dtype(qkv))
    return _attend(qkv, _slots(qkv, index, prefix, partition), base, heads, scale)


class WindowCore(torch.autograd.Function):
    """``qkv[B, N, 3C]`` (tokens in order; q|k|v side by side, heads inside each), ``index[nW, T]`` (the token
    each window slot reads: the P prefix tokens first, then grid tokens or -1 for padding; constant), ``prefix``
    (P), ``bias[h, T, T]``, ``mask[nW, T, T]`` or None (window ``r % nW`` of row r; constant; it must mask padding
    slots as keys), ``partition``: (H, W, M) when ``index`` is the plain partition of an H×W grid into M×M windows
    (no shift, padding or prefix) or None -> merged heads ``[B, N, C]`` in token order (a prefix token gets the mean
    of its outputs over the windows), with the bias' gradient. Forward keeps the windows' q/k/v heads and the
    probabilities or log-sum-exp; each block of windows writes its outputs (q/k/v gradients) into the token rows:
    through row copies (:class:`_GatheredSlots`), or through strided views of a plain partition
    (:class:`_GridSlots`)."""

    @staticmethod
    def forward(ctx: Any, qkv: Tensor, index: Tensor, prefix: int, bias: Tensor, mask: Optional[Tensor], heads: int,
                scale: float, partition: Optional[tuple[int, int, int]] = None) -> Tensor:
        B, N, C3 = qkv.shape
        nw, T = index.shape
        dtype = _score_dtype(qkv)
        keep = keeps_probs(T, C3 // (3 * heads))
        stats = torch.empty(B * nw * heads, T, T if keep else 1, dtype=dtype, device=qkv.device)  # probs or lse
        q_k_v = qkv.new_empty(3, B * nw * heads, T, C3 // (3 * heads))  # the windows' heads, kept for backward
        base, slots = _score_base(bias, mask, dtype), _slots(qkv, index, prefix, partition)
        out = _attend(qkv, slots, base, heads, scale, q_k_v, stats, keep)
        ctx.save_for_backward(q_k_v, base, stats)
        ctx.slots, ctx.heads, ctx.scale, ctx.keep, ctx.bias_dtype = slots, heads, scale, keep, bias.dtype
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
        q_k_v, base, stats = ctx.saved_tensors
        slots, heads, T = ctx.slots, ctx.heads, base.shape[-1]
        grad = grad.contiguous()
        d_qkv, d_prefix = slots.output(q_k_v, 3 * grad.shape[-1])
        d_bias = torch.zeros(base.shape[1:], dtype=stats.dtype, device=base.device)
        with torch.autocast(grad.device.type, enabled=False):
            for win in slots.blocks(2 * heads * T * T):  # half the forward's windows: a lower peak
                q, k, v = q_k_v[:, win.start * heads:win.stop * heads]  # [r·h, T, d]
                d_o = slots.read_grad(grad, win, heads)
                rows = stats[win.start * heads:win.stop * heads]
                p = rows if ctx.keep else _scores(q, k, base, win, ctx.scale).sub_(rows).exp2_()  # probabilities
                slots.write(d_qkv, d_prefix, win, _window_backward(q, k, v, d_o, p, heads, ctx.scale, d_bias), heads)
        return (
            slots.tokens_of(d_qkv, d_prefix, mean=False), None, None, d_bias.to(ctx.bias_dtype), None, None, None, None
        )


def _window_backward(
    q: Tensor, k: Tensor, v: Tensor, d_o: Tensor, p: Tensor, heads: int, scale: float, d_bias: Tensor
) -> list[Tensor]:
    """``[dQ, dK, dV]`` ``[r·h, T, d]`` of a block of windows (adds the bias gradient to ``d_bias[h, T, T]``).

    Args:
        q, k, v, d_o: ``[r·h, T, d]``, the output gradient weighted by each slot's share. p: the probabilities
        ``[r·h, T, T]``. heads, scale: as in forward.
    """
    d_s = torch.bmm(d_o, v.transpose(1, 2)).to(p.dtype).mul_(p)  # P ⊙ dP, dP = dO Vᵀ
    d_v = torch.bmm(p.to(d_o.dtype).transpose(1, 2), d_o)  # dV = Pᵀ dO
    d_s.addcmul_(p, d_s.sum(-1, keepdim=True), value=-1)  # dS = P ⊙ (dP - rowsum(P ⊙ dP))
    d_bias += d_s.view(-1, heads, *d_s.shape[1:]).sum(0)
    d_s = d_s.mul_(scale).to(q.dtype)
    return [torch.bmm(d_s, k), torch.bmm(d_s.transpose(1, 2), q), d_v]  # dQ = dS K·scale, dK = dSᵀ Q·scale
