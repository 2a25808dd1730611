"""The training path of window attention: ``softmax(QKᵀ/√d + bias + mask)V`` per window in one autograd node.

SDPA with the learned relative position bias as its mask takes the math kernel on the CPU (only it
gives the mask a gradient), which stores the ``[B·nW, h, T, T]`` probabilities and contiguous copies of
q, k and v. :class:`WindowCore` takes the fused projection ``qkv[B·nW, T, 3C]`` of the window tokens and
returns merged heads ``[B·nW, T, C]``; it saves only ``qkv``, the bias and the log-sum-exp
``[B·nW, h, T]``, recomputes the probabilities in backward and writes the q/k/v gradients into one
``[B·nW, T, 3C]`` buffer. Both passes work through blocks of windows whose scores stay cache-sized
(:data:`SCORE_ELEMENTS`). Autocast is off inside: the matmuls take q, k, v in
their dtype (bfloat16 under autocast, as timm's Swin computes them), scores, probabilities and the
log-sum-exp are float32 (float64 stays float64); gradients come back in the inputs' dtypes.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from vitzoo.attention.base import tracing


def core_applies(qkv: Tensor, p_drop: float) -> bool:
    """:class:`WindowCore` runs the step: training on the CPU without attention dropout, eager (not traced
    or compiled, where the plain SDPA expression is kept)."""
    return (torch.is_grad_enabled() and qkv.requires_grad and qkv.device.type == "cpu" and p_drop == 0.0
            and not tracing())


# Scores per block of windows and CPU thread (1 MB in float32): the block's scores, probabilities and
# their gradients stay in cache. Smaller blocks lower the layer's peak (64x64 tokens, 8x8 windows:
# 110 MB here, 104 MB at 1 << 16) but made a swin_cifar training step 5-15% slower (4x4 windows).
SCORE_ELEMENTS = 1 << 18


def _blocks(R: int, per_window: int) -> list[slice]:
    """Window ranges of about :data:`SCORE_ELEMENTS` scores per thread (``per_window`` = h·T² each)."""
    step = max(1, SCORE_ELEMENTS * max(1, torch.get_num_threads()) // per_window)
    return [slice(i, min(i + step, R)) for i in range(0, R, step)]


def _heads(t: Tensor) -> Tensor:
    """``t[r, T, h, d]`` (a strided view) -> contiguous ``[r·h, T, d]``: one copy."""
    r, T, h, d = t.shape
    return t.transpose(1, 2).reshape(r * h, T, d)


def _put(dst: Tensor, src: Tensor) -> None:
    """Writes heads ``src[r·h, T, d]`` into the merged-heads view ``dst[r, T, h, d]`` (casting to its dtype)."""
    r, T, h, d = dst.shape
    dst.copy_(src.view(r, h, T, d).transpose(1, 2))


def _scores(q: Tensor, k: Tensor, bias: Tensor, mask: Optional[Tensor], windows: slice, scale: float,
            dtype: torch.dtype) -> Tensor:
    """``QKᵀ·scale + bias (+ mask)`` ``[r·h, T, T]`` in ``dtype`` of windows ``windows`` (rows ``b·nW + w``: mask ``w``)."""
    r, (h, T, _) = windows.stop - windows.start, bias.shape
    s = q.new_empty(r, h, T, T, dtype=dtype)  # QKᵀ is accumulated into it
    if mask is None:
        s.copy_(bias.expand(r, h, T, T))
    else:
        rows = torch.arange(windows.start, windows.stop, device=mask.device) % mask.shape[0]  # window of each row
        torch.add(bias, mask.index_select(0, rows)[:, None], out=s)
    s = s.view(r * h, T, T)
    if q.dtype == dtype:
        return s.baddbmm_(q, k.transpose(1, 2), alpha=scale)  # QKᵀ: T·T·d per window and head
    return s.add_(torch.bmm(q, k.transpose(1, 2)), alpha=scale)  # bfloat16/half QKᵀ, float32 scores


class WindowCore(torch.autograd.Function):
    """``qkv[R, T, 3C]`` (q|k|v side by side, heads inside each), ``bias[h, T, T]``, ``mask[nW, T, T]`` or
    None (window ``r % nW`` of row r; constant) -> ``[R, T, C]`` merged heads, with the bias' gradient."""

    @staticmethod
    def forward(ctx: Any, qkv: Tensor, bias: Tensor, mask: Optional[Tensor], heads: int, scale: float) -> Tensor:
        R, T, C3 = qkv.shape
        d = C3 // (3 * heads)
        dtype = torch.float64 if qkv.dtype == torch.float64 else torch.float32
        parts = qkv.view(R, T, 3, heads, d)
        out = qkv.new_empty(R, T, heads, d)
        lse = torch.empty(R * heads, T, 1, dtype=dtype, device=qkv.device)
        with torch.autocast(qkv.device.type, enabled=False):
            for win in _blocks(R, heads * T * T):
                q, k, v = (_heads(parts[win, :, i]) for i in range(3))  # [r·h, T, d]
                s = _scores(q, k, bias, mask, win, scale, dtype)
                rows = slice(win.start * heads, win.stop * heads)
                torch.logsumexp(s, -1, keepdim=True, out=lse[rows])
                _put(out[win], torch.bmm(s.sub_(lse[rows]).exp_().to(v.dtype), v))  # softmax, then AV: T·T·d
        ctx.save_for_backward(qkv, bias, mask, lse)
        ctx.heads, ctx.scale = heads, scale
        return out.view(R, T, heads * d)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
        qkv, bias, mask, lse = ctx.saved_tensors
        heads, scale = ctx.heads, ctx.scale
        R, T, C3 = qkv.shape
        d = C3 // (3 * heads)
        parts, grad = qkv.view(R, T, 3, heads, d), grad.view(R, T, heads, d)
        d_qkv = torch.empty_like(qkv)
        d_parts = d_qkv.view(R, T, 3, heads, d)
        d_bias = torch.zeros(bias.shape, dtype=lse.dtype, device=bias.device)
        with torch.autocast(qkv.device.type, enabled=False):
            for win in _blocks(R, heads * T * T):
                q, k, v = (_heads(parts[win, :, i]) for i in range(3))  # [r·h, T, d]
                d_o = _heads(grad[win])
                p = _scores(q, k, bias, mask, win, scale, lse.dtype)
                p = p.sub_(lse[win.start * heads:win.stop * heads]).exp_()  # probabilities, recomputed
                d_s = p * torch.bmm(d_o, v.transpose(1, 2))
                d_s.addcmul_(p, d_s.sum(-1, keepdim=True), value=-1)  # dS = P ⊙ (dP - rowsum(P ⊙ dP)), dP = dO Vᵀ
                d_bias += d_s.view(-1, heads, T, T).sum(0)
                _put(d_parts[win, :, 2], torch.bmm(p.to(v.dtype).transpose(1, 2), d_o))  # dV = Pᵀ dO
                d_s = d_s.mul_(scale).to(q.dtype)
                _put(d_parts[win, :, 0], torch.bmm(d_s, k))  # dQ = dS K·scale
                _put(d_parts[win, :, 1], torch.bmm(d_s.transpose(1, 2), q))  # dK = dSᵀ Q·scale
        return d_qkv, d_bias.to(bias.dtype), None, None, None
