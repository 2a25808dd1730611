"""Helpers shared across the attention families: the dense softmax reference, the SDPA call and its cost,
token resampling for fixed-length mixers, and whether sizes that follow the data may be read from it
(:func:`fixed_sizes`). The fast paths' helpers (chunking of the CPU cores, the exp2 scale) are in
:mod:`vitzoo.ops.common`.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from vitzoo.attention.base import Grid
from vitzoo.ops.common import tracing
from vitzoo.ops.dispatch import select
from vitzoo.ops.sdpa import fp32_backward_sdpa

_COUNTING = [False]  # inside counting_trace()


@contextmanager
def counting_trace() -> Iterator[None]:
    """Marks the traces taken inside as FLOP counts of this one forward (fvcore's ``torch.jit`` trace): a backend
    then reads its data-dependent sizes from the data as in eager mode (:func:`fixed_sizes` is False there)."""
    before, _COUNTING[0] = _COUNTING[0], True
    try:
        yield
    finally:
        _COUNTING[0] = before


def fixed_sizes() -> bool:
    """Whether sizes that follow the data must be fixed: under ``torch.compile``/``torch.export``, ONNX export or
    a ``torch.jit`` trace that may run on other data (:func:`vitzoo.cpu_kernels.tracing`), but not inside
    :func:`counting_trace`."""
    return tracing() and not _COUNTING[0]


def resample_tokens(t: Tensor, src: Grid, dst: Grid, num_prefix: int, dim: int) -> Tensor:
    """Resample axis ``dim`` of ``t`` (length ``P + src_H·src_W``) to ``P + dst_H·dst_W``.

    Prefix entries are kept; grid entries are bilinearly interpolated as an image. Used by
    fixed-length mixers with ``interpolate: true``.
    """
    if tuple(src) == tuple(dst):
        return t
    t = t.movedim(dim, -1)
    lead = t.shape[:-1]
    prefix, body = t[..., :num_prefix], t[..., num_prefix:].reshape(-1, 1, *src)  # [L, 1, H, W]
    body = F.interpolate(body, size=tuple(dst), mode="bilinear", align_corners=False).reshape(*lead, -1)
    return torch.cat([prefix, body], dim=-1).movedim(-1, dim)


def dense_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Optional[Tensor] = None,
                    bias: Optional[Tensor] = None) -> Tensor:
    """Plain ``softmax(QKᵀ/√d + bias)V`` for references and tests (materialises N×N on purpose).

    Args:
        q: ``[..., Nq, d]``; k, v: ``[..., Nk, d]``.
        allowed: boolean ``[..., Nq, Nk]`` (broadcastable), True where a query may attend.
        bias: additive ``[..., Nq, Nk]`` (broadcastable).
    """
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # [..., Nq, Nk]
    if bias is not None:
        scores = scores + bias
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(dim=-1) @ v


def sdpa_flops(batch: int, heads: int, nq: int, nk: int, d: int, dv: Optional[int] = None) -> int:
    """MACs of ``softmax(QKᵀ)V``: ``QKᵀ`` is nq·nk·d, ``AV`` is nq·nk·dv, per batch and head."""
    return batch * heads * nq * nk * (d + (dv if dv is not None else d))


def sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0) -> Tensor:
    """``F.scaled_dot_product_attention`` (fused kernels); vitzoo's fvcore handle counts it. CPU training in bf16 or
    fp16 on short key sequences runs the same forward with its backward in fp32 (:mod:`vitzoo.ops.sdpa`, picked by
    ``select("sdpa", ...)``).

    Args:
        q: ``[B, h, Nq, d]``; k: ``[B, h, Nk, d]``; v: ``[B, h, Nk, dv]``.
        attn_mask: additive or boolean mask broadcastable to ``[B, h, Nq, Nk]``, or ``None``.
        dropout_p: attention dropout probability.

    Some CPU kernels turn a NaN query into finite weights; as ``softmax(QKᵀ)V`` defines, a query with a
    non-finite entry gives a non-finite output row here (the added term is 0 for finite queries).
    """
    if select("sdpa", q, k, v, attn_mask, dropout_p) == "fp32_backward":
        out = fp32_backward_sdpa(q, k, v, attn_mask)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    return out + q.sum(dim=-1, keepdim=True) * 0
