"""The fast path of Efficient Attention (``efficient``): ``ρq(Q)(ρk(K)ᵀV)`` from ``qkv`` to merged heads in one
autograd node.

Paper: Shen et al., "Efficient Attention: Attention with Linear Complexities", WACV 2021,
https://arxiv.org/abs/1812.01243.

As :mod:`vitzoo.ops.feature` does for kernel feature maps: saves ``qkv`` and the small context
``ρk(K)ᵀV`` ``[B, h, d, d]``, recomputes the two softmaxes in backward, and works through (image, head)
chunks of about :data:`~vitzoo.ops.common.CHUNK_ELEMENTS` elements per thread.
"""
from __future__ import annotations

import torch
from torch import Tensor

from vitzoo.ops.common import head_chunks
from vitzoo.ops.dispatch import select


class EfficientAttentionCore(torch.autograd.Function):
    """Efficient Attention ``ρq(Q)(ρk(K)ᵀV)`` from ``qkv[B, N, 3C]`` to ``out[B, N, C]``, saving ``qkv``
    and the context ``ρk(K)ᵀV`` ``[B, h, d, d]``; the softmaxes (ρq over each query's d features,
    ρk over the N positions of each key feature) are recomputed in backward, chunk by chunk.
    Computed in the input's dtype (no sums that grow with N: the softmaxes are normalised).
    """

    @staticmethod
    def forward(ctx, qkv: Tensor, heads: int) -> Tensor:
        out, context = efficient_forward(qkv, heads)
        ctx.heads = heads
        ctx.save_for_backward(qkv, context)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        qkv, context = ctx.saved_tensors
        heads = ctx.heads
        B, N, C3 = qkv.shape
        d = C3 // 3 // heads
        grad_qkv = torch.empty_like(qkv, memory_format=torch.contiguous_format)
        g5, q5, o5 = grad_qkv.view(B, N, 3, heads, d), qkv.reshape(B, N, 3, heads, d), grad.reshape(B, N, heads, d)
        for b, j in head_chunks(B, heads, N * d, qkv.device):
            g = o5[b, :, j].transpose(1, 2)  # [b, h, N, d]
            rho_q = q5[b, :, 0, j].transpose(1, 2).softmax(dim=-1)
            grad_context = rho_q.transpose(-2, -1) @ g  # [b, h, d, d]
            grad_rho = g @ context[b, j].transpose(-2, -1)  # [b, h, N, d]
            g5[b, :, 0, j] = torch._softmax_backward_data(grad_rho, rho_q, -1, rho_q.dtype).transpose(1, 2)
            del rho_q, grad_rho
            rho_k = q5[b, :, 1, j].transpose(1, 2).softmax(dim=-2)
            v = q5[b, :, 2, j].transpose(1, 2)
            g5[b, :, 2, j] = (rho_k @ grad_context).transpose(1, 2)  # ∂L/∂V
            grad_rho = v @ grad_context.transpose(-2, -1)  # [b, h, N, d]
            g5[b, :, 1, j] = torch._softmax_backward_data(grad_rho, rho_k, -2, rho_k.dtype).transpose(1, 2)
        return grad_qkv, None


def efficient_forward(qkv: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """Forward of :class:`EfficientAttentionCore` without autograd: ``out`` ``[B, N, C]`` and the
    context ``[B, h, d, d]``."""
    B, N, C3 = qkv.shape
    d = C3 // 3 // heads
    out = qkv.new_empty(B, N, heads * d)
    context = qkv.new_empty(B, heads, d, d)
    q5, o5 = qkv.reshape(B, N, 3, heads, d), out.view(B, N, heads, d)
    for b, j in head_chunks(B, heads, N * d, qkv.device):
        rho_k = q5[b, :, 1, j].transpose(1, 2).softmax(dim=-2)  # [b, h, N, d]
        context_c = rho_k.transpose(-2, -1) @ q5[b, :, 2, j].transpose(1, 2)  # ρk(K)ᵀV: N·d·d per head
        context[b, j] = context_c
        o5[b, :, j] = (q5[b, :, 0, j].transpose(1, 2).softmax(dim=-1) @ context_c).transpose(1, 2)  # N·d·d
    return out, context


def efficient_attention_qkv(qkv: Tensor, heads: int) -> Tensor:
    """``ρq(Q)(ρk(K)ᵀV)`` per head from the fused projection ``qkv[B, N, 3C]`` to merged heads ``[B, N, C]``
    (:class:`EfficientAttentionCore`; a plain forward when tracing with ``torch.jit.trace``).

    Args:
        qkv: q, k and v side by side, heads ``[h, d]`` within each.
        heads: h.
    """
    if select("fused_qkv") == "plain_forward":
        return efficient_forward(qkv, heads)[0]
    return EfficientAttentionCore.apply(qkv, heads)
