"""CPU's fused attention with its backward in fp32 for short key sequences (``softmax(QKᵀ/√d + mask)V``).

Under bf16 or fp16 autocast, the backward of CPU's flash-attention kernel is slow on short sequences: it works
through each (image, head) pair's small blocks in the reduced type. On 65 keys (``vit_cifar``'s 8×8 grid and
class token) it takes 2–3.5× as long as the same kernel on fp32 copies of its tensors; from about 512 keys the
reduced-type kernel is the faster one (AMD EPYC, 1 and 2 threads, ``torch`` 2.14). :func:`fp32_backward_sdpa`
runs the reduced-type forward kernel, so the output and the tensors saved for backward (q, k, v, the output and
the row log-sum-exp) are exactly the native op's, and the fp32 backward kernel on upcast copies of them, rounding
each gradient once to its input's type. :func:`flash_backward` is that backward (axial attention's pass node calls
it too), and :func:`fp32_backward_workspace` what its copies add to the backward.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from vitzoo.cpu_kernels import tracing

__all__ = ["FP32_BACKWARD_KEYS", "REDUCED", "applies", "flash_backward", "fp32_backward_sdpa",
           "fp32_backward_workspace"]

FP32_BACKWARD_KEYS = 256  # longest key sequence whose CPU backward runs in fp32 (1.1x faster at 256, 0.9x at 512)
REDUCED = (torch.bfloat16, torch.float16)  # input types whose CPU flash backward is the slow one

_FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def applies(q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0) -> bool:
    """Whether a ``scaled_dot_product_attention`` call trains through :func:`fp32_backward_sdpa`: on the CPU, in
    bf16 or fp16, with a gradient to compute, at most :data:`FP32_BACKWARD_KEYS` keys, no dropout, no mask or a
    floating mask without a gradient, 4-D tensors with unit last stride and equal heads (the flash kernel's own
    conditions), eager.

    Args:
        q: ``[B, h, Nq, d]``; k: ``[B, h, Nk, d]``; v: ``[B, h, Nk, dv]``.
        attn_mask: additive mask broadcastable to ``[B, h, Nq, Nk]``, or ``None``.
        dropout_p: attention dropout probability.
    """
    tensors = (q, k, v)
    if q.device.type != "cpu" or q.dtype not in REDUCED or dropout_p != 0.0 or tracing():
        return False
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors):
        return False
    if attn_mask is not None and (not attn_mask.is_floating_point() or attn_mask.requires_grad):
        return False
    shapes = all(t.dim() == 4 and t.dtype == q.dtype and t.stride(-1) == 1 for t in tensors)
    return (shapes and q.shape[1] == k.shape[1] == v.shape[1] and 0 < k.shape[-2] <= FP32_BACKWARD_KEYS
            and q.shape[-2] > 0)


class _Fp32Backward(torch.autograd.Function):
    """The reduced-type flash forward, saving what the native op saves; the fp32 flash backward."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor],
                scale: Optional[float]) -> Tensor:
        out, lse = _FORWARD(q, k, v, 0.0, False, attn_mask=attn_mask, scale=scale)  # [B, h, Nq, dv], [B, h, Nq]
        ctx.scale = scale
        ctx.save_for_backward(q, k, v, out, lse, attn_mask)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
        q, k, v, out, lse, attn_mask = ctx.saved_tensors
        return (*flash_backward(grad, q, k, v, out, lse, attn_mask, ctx.scale), None, None)


def flash_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                   attn_mask: Optional[Tensor] = None, scale: Optional[float] = None) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of q, k and v from CPU's flash-attention backward kernel: on fp32 copies where the inputs are
    bf16 or fp16 and there are at most :data:`FP32_BACKWARD_KEYS` keys (each gradient rounded once to its input's
    type), else the native kernel. No dropout, not causal.

    Args:
        grad: the output's gradient ``[B, h, Nq, dv]``; q ``[B, h, Nq, d]``, k ``[B, h, Nk, d]``, v ``[B, h, Nk, dv]``,
            out ``[B, h, Nq, dv]`` and the row log-sum-exp ``lse [B, h, Nq]`` of the forward kernel.
        attn_mask: the forward's additive mask, or ``None``; scale: the forward's score scale (``None``: 1/√d).
    """
    if q.dtype not in REDUCED or k.shape[-2] > FP32_BACKWARD_KEYS:
        return _BACKWARD(grad, q, k, v, out, lse, 0.0, False, attn_mask=attn_mask, scale=scale)
    mask = None if attn_mask is None else attn_mask.float()
    grads = _BACKWARD(grad.float(), q.float(), k.float(), v.float(), out.float(), lse, 0.0, False, attn_mask=mask,
                      scale=scale)
    return grads[0].to(q.dtype), grads[1].to(k.dtype), grads[2].to(v.dtype)


def fp32_backward_sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor] = None,
                       scale: Optional[float] = None) -> Tensor:
    """``softmax(scale·QKᵀ + attn_mask)V`` -> ``[B, h, Nq, dv]``, with the backward in fp32 (where :func:`applies`).

    Args:
        q: ``[B, h, Nq, d]``; k: ``[B, h, Nk, d]``; v: ``[B, h, Nk, dv]``, all bf16 or all fp16.
        attn_mask: additive mask broadcastable to ``[B, h, Nq, Nk]`` without a gradient, or ``None``.
        scale: the score scale (``None``: 1/√d).
    """
    return _Fp32Backward.apply(q, k, v, attn_mask, scale)


def fp32_backward_workspace(batch_heads: int, nq: int, nk: int, d: int, dv: Optional[int] = None,
                            amp: Optional[torch.dtype] = None) -> int:
    """Bytes the fp32 backward allocates beside the gradients: fp32 copies of the output's gradient, q, k, v and
    the output, and the fp32 gradients of q, k and v, ``8·bh·(Nq + Nk)(d + dv)``; 0 where the backward runs the
    native kernel (no reduced autocast type, or more than :data:`FP32_BACKWARD_KEYS` keys).

    Args:
        batch_heads: images × heads of the call; nq, nk: queries and keys per pair; d: q/k width; dv: v width
            (default ``d``); amp: the autocast dtype or ``None``.
    """
    if amp not in REDUCED or not 0 < nk <= FP32_BACKWARD_KEYS:
        return 0
    dv = d if dv is None else dv
    return 8 * batch_heads * (nq + nk) * (d + dv)
