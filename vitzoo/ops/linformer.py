"""Linformer's fused CPU/GPU path: ``softmax(Q (Eᵀ K)ᵀ · scale) (Fᵀ V)`` from the fused projection
``qkv[B, N, 3C]`` to merged heads in one autograd node (:class:`LinformerCore`) that saves only ``qkv`` and
``E``, ``F``: the projected keys and values and the ``[N, k]`` probabilities are recomputed in backward chunk
by chunk, and the gradients of q, k and v are written straight into one ``[B, N, 3C]`` buffer. The backend
(:mod:`vitzoo.attention.low_rank.linformer`) defines what is computed.
"""
from __future__ import annotations

import torch
from torch import Tensor

from vitzoo.ops.common import head_chunks
from vitzoo.ops.dispatch import select


def _projection_slice(p: Tensor, heads: slice) -> Tensor:
    """A chunk's E or F: ``[1, N, k]`` shared by the heads, or ``[h, N, k]`` cut to the chunk's heads."""
    return p if p.shape[0] == 1 else p[heads]


def _chunk_probabilities(q: Tensor, k: Tensor, v: Tensor, e: Tensor, f: Tensor,
                         scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """Projected keys and values ``Eᵀ K``, ``Fᵀ V`` ``[b, h, k, d]`` of a chunk and its probabilities
    ``softmax(Q (Eᵀ K)ᵀ · scale)`` ``[b, h, N, k]``."""
    k_p = e.transpose(-2, -1) @ k  # Eᵀ K [b, h, k, d]: N·k·d per head
    v_p = f.transpose(-2, -1) @ v  # Fᵀ V [b, h, k, d]: N·k·d per head
    p = (q @ k_p.transpose(-2, -1)).mul_(scale).softmax(dim=-1)  # [b, h, N, k]: N·k·d per head
    return k_p, v_p, p


class LinformerCore(torch.autograd.Function):
    """``softmax(Q (Eᵀ K)ᵀ · scale) (Fᵀ V)`` from ``qkv[B, N, 3C]`` to ``out[B, N, C]``, saving ``qkv``
    and the projections only (module docstring). Arguments as :func:`linformer_attention_qkv`.
    """

    @staticmethod
    def forward(ctx, qkv: Tensor, proj: Tensor, heads: int, scale: float) -> Tensor:
        with torch.autocast(qkv.device.type, enabled=False):
            out = linformer_forward(qkv, proj, heads, scale)
        ctx.heads, ctx.scale = heads, scale
        ctx.save_for_backward(qkv, proj)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        qkv, proj = ctx.saved_tensors
        heads, scale = ctx.heads, ctx.scale
        B, N, C3 = qkv.shape
        d = C3 // 3 // heads
        grad_qkv = torch.empty_like(qkv, memory_format=torch.contiguous_format)
        grad_proj = torch.zeros_like(proj)
        grad_e, grad_f = grad_proj[0], grad_proj[-1]  # the same matrix when keys and values share it
        g5, q5, o5 = grad_qkv.view(B, N, 3, heads, d), qkv.reshape(B, N, 3, heads, d), grad.reshape(B, N, heads, d)
        ec, fc = proj[0].to(qkv.dtype), proj[-1].to(qkv.dtype)
        with torch.autocast(qkv.device.type, enabled=False):
            # three [N, k] blocks per (image, head) at once: the probabilities, their gradient and the scores' gradient
            for b, j in head_chunks(B, heads, 3 * N * proj.shape[-1], qkv.device):
                q, k, v = (q5[b, :, i, j].transpose(1, 2) for i in range(3))  # [b, h, N, d] views
                e_c, f_c = _projection_slice(ec, j), _projection_slice(fc, j)
                k_p, v_p, p = _chunk_probabilities(q, k, v, e_c, f_c, scale)
                g = o5[b, :, j].transpose(1, 2)  # ∂L/∂out [b, h, N, d]
                grad_vp = p.transpose(-2, -1) @ g  # [b, h, k, d]
                grad_s = torch._softmax_backward_data(g @ v_p.transpose(-2, -1), p, -1, p.dtype).mul_(scale)
                del p
                g5[b, :, 0, j] = (grad_s @ k_p).transpose(1, 2)  # ∂L/∂Q
                grad_kp = grad_s.transpose(-2, -1) @ q  # [b, h, k, d]
                del grad_s
                g5[b, :, 1, j] = (e_c @ grad_kp).transpose(1, 2)  # ∂L/∂K = E ∂L/∂(EᵀK)
                g5[b, :, 2, j] = (f_c @ grad_vp).transpose(1, 2)  # ∂L/∂V
                _accumulate(grad_e, k @ grad_kp.transpose(-2, -1), j)  # ∂L/∂E = K ∂L/∂(EᵀK)ᵀ [b, h, N, k]
                _accumulate(grad_f, v @ grad_vp.transpose(-2, -1), j)
        return grad_qkv, grad_proj, None, None


def _accumulate(grad: Tensor, part: Tensor, heads: slice) -> None:
    """Add a chunk's ``[b, h, N, k]`` gradient of E or F to ``grad`` ``[h or 1, N, k]`` (summed over images,
    and over heads when they share the matrix)."""
    if grad.shape[0] == 1:
        grad += part.sum(dim=(0, 1)).to(grad.dtype)
    else:
        grad[heads] += part.sum(dim=0).to(grad.dtype)


def linformer_forward(qkv: Tensor, proj: Tensor, heads: int, scale: float) -> Tensor:
    """Forward of :class:`LinformerCore` without autograd, chunk by chunk. Arguments as
    :func:`linformer_attention_qkv`."""
    B, N, C3 = qkv.shape
    d = C3 // 3 // heads
    out = qkv.new_empty(B, N, heads * d)
    q5, o5 = qkv.reshape(B, N, 3, heads, d), out.view(B, N, heads, d)
    e, f = proj[0].to(qkv.dtype), proj[-1].to(qkv.dtype)
    for b, j in head_chunks(B, heads, N * proj.shape[-1], qkv.device):
        q, k, v = (q5[b, :, i, j].transpose(1, 2) for i in range(3))  # [b, h, N, d] views
        _, v_p, p = _chunk_probabilities(q, k, v, _projection_slice(e, j), _projection_slice(f, j), scale)
        o5[b, :, j] = (p @ v_p).transpose(1, 2)  # [b, N, h, d]: N·k·d per head
    return out


def linformer_attention_qkv(qkv: Tensor, proj: Tensor, heads: int, scale: float) -> Tensor:
    """Linformer attention per head from the fused projection to the merged heads
    (:class:`LinformerCore`; a plain forward when tracing with ``torch.jit.trace``).

    Args:
        qkv: ``[B, N, 3C]``, q, k and v side by side, heads ``[h, d]`` within each.
        proj: ``[E, F]`` ``[2, h, N, k]``: key and value projections, ``[2, 1, N, k]`` shared by the heads
            or ``[1, 1, N, k]`` (one matrix for keys, values and heads).
        heads: h.
        scale: factor of the scores (``1/√d``).

    Returns:
        ``out`` ``[B, N, C]`` (heads merged) in ``qkv``'s dtype.
    """
    if select("fused_qkv") == "plain_forward":
        return linformer_forward(qkv, proj, heads, scale)
    return LinformerCore.apply(qkv, proj, heads, scale)
