"""Feature-map (linearised) attention: ``softmax(qᵀk)`` replaced by ``φ(q)ᵀφ(k)``.

    out_i = Σ_j φ(q_i)ᵀφ(k_j) v_j / Σ_j φ(q_i)ᵀφ(k_j) = φ(q_i)ᵀ(φ(K)ᵀV) / φ(q_i)ᵀ(φ(K)ᵀ1)

:func:`feature_map_attention` computes the right-hand side (linear in N, never N×N);
:func:`feature_map_attention_quadratic` the left-hand side (the explicit N×N matrix) for references.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from vitzoo.costs import Saved


def feature_map_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, eps: Optional[float] = None) -> Tensor:
    """``φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1)`` in linear time.

    Args:
        phi_q, phi_k: features ``[B, h, N, m]``.
        v: values ``[B, h, N, d]``.
        eps: if given, the normaliser is clamped to at least ``eps`` (feature maps that can go negative).

    The sums over N (``φ(K)ᵀV``, ``φ(K)ᵀ1``) and the normaliser are computed in float32 (float64
    inputs stay float64) even under fp16/bf16 autocast: ``φ(K)ᵀ1`` grows with N and overflows fp16
    (65504) on large grids, and bf16's 8-bit mantissa would round the normaliser. The result has
    ``v``'s dtype.
    """
    acc = torch.promote_types(v.dtype, torch.float32)  # at least float32
    with torch.autocast(v.device.type, enabled=False):
        phi_q, phi_k, v_acc = phi_q.to(acc), phi_k.to(acc), v.to(acc)
        v1 = F.pad(v_acc, (0, 1), value=1.0)  # [V | 1] [B, h, N, d+1]: φ(K)ᵀ1 rides along with φ(K)ᵀV
        kvz = phi_k.transpose(-2, -1) @ v1  # [φ(K)ᵀV | φ(K)ᵀ1] [B, h, m, d+1]: N·m·(d+1) per head
        out = phi_q @ kvz  # [φ(Q)(φ(K)ᵀV) | φ(Q)(φ(K)ᵀ1)] [B, h, N, d+1]: N·m·(d+1) per head
        return (out[..., :-1] / _floor(out[..., -1:], eps)).to(v.dtype)


def feature_map_attention_quadratic(phi_q: Tensor, phi_k: Tensor, v: Tensor, eps: Optional[float] = None) -> Tensor:
    """Reference: the explicit kernel matrix ``A = φ(Q)φ(K)ᵀ``, then ``AV / A1`` (materialises N×N).

    Args: as :func:`feature_map_attention`.
    """
    a = phi_q @ phi_k.transpose(-2, -1)  # [B, h, N, N], a_ij = φ(q_i)·φ(k_j)
    return (a @ v) / _floor(a.sum(dim=-1, keepdim=True), eps)


def feature_map_attention_flops(heads: int, n: int, features: int, head_dim: int) -> int:
    """MACs of :func:`feature_map_attention` for one image: ``2·h·N·m·(d+1)``.

    The normaliser is computed by the same matmuls as the numerator (a ones column appended to V),
    one pass over the features instead of two matrix-vector products.
    """
    kvz = n * features * (head_dim + 1)  # φ(K)ᵀ[V | 1]
    out = n * features * (head_dim + 1)  # φ(Q)·[φ(K)ᵀV | φ(K)ᵀ1]
    return heads * (kvz + out)


def _floor(den: Tensor, eps: Optional[float]) -> Tensor:
    return den if eps is None else den.clamp_min(eps)


def feature_core_memory(batch: int, n: int, heads: int, head_dim: int, features: int, qkv_itemsize: int,
                        shifts: bool) -> list[Saved]:
    """What :class:`vitzoo.ops.feature.FeatureAttentionCore` keeps for backward (its compiled CPU kernel returns
    the same tensors, so the dispatch's choice does not change it): the fused projection and small results.

    Args:
        batch: images; n: tokens; heads: h; head_dim: d; features: m (features of φ per head).
        qkv_itemsize: bytes per element of the ``qkv`` the core takes.
        shifts: the ``"exp"`` map's query and key stabilisers are kept too.
    """
    rows = batch * heads * n  # one float32 per (image, head, token)
    items = [Saved("q|k|v (projection output)", batch * n * 3 * heads * head_dim, qkv_itemsize),  # [B, N, 3C]
             Saved("φ(K)ᵀ[V | 1]", batch * heads * features * (head_dim + 1), 4),  # [B, h, m, d+1] float32
             Saved("normaliser φ(Q)φ(K)ᵀ1", rows, 4)]  # [B, h, N, 1] float32
    if shifts:
        items += [Saved("query stabiliser", rows, 4), Saved("key stabiliser", rows, 4)]  # [B, h, N, 1] each
    return items
