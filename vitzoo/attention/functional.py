"""Helpers shared across the attention families: the dense softmax reference, the SDPA call and its cost,
token resampling for fixed-length mixers, (image, head) chunking of the CPU cores, and whether sizes that
follow the data may be read from it (:func:`fixed_sizes`).
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
from vitzoo.cpu_kernels import tracing

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


# exp(x) = 2^(x·log2 e): the CPU kernels (window, block and kernel attention) fold log2 e into a scale they
# apply anyway and call exp2_. torch's CPU exp (MKL's vector exp) is 1.8x slower than exp2 on ordinary inputs,
# 4-5x on -inf (masked scores) and ~30x on inputs that underflow (Swin's -100 mask); exp2 has no such
# slow path (2-core AMD EPYC, Zen 2).
LOG2E = math.log2(math.e)


def sdpa_flops(batch: int, heads: int, nq: int, nk: int, d: int, dv: Optional[int] = None) -> int:
    """MACs of ``softmax(QKᵀ)V``: ``QKᵀ`` is nq·nk·d, ``AV`` is nq·nk·dv, per batch and head."""
    return batch * heads * nq * nk * (d + (dv if dv is not None else d))


def sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0) -> Tensor:
    """``F.scaled_dot_product_attention`` (fused kernels); vitzoo's fvcore handle counts it.

    Some CPU kernels turn a NaN query into finite weights; as ``softmax(QKᵀ)V`` defines, a query with a
    non-finite entry gives a non-finite output row here (the added term is 0 for finite queries).
    """
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    return out + q.sum(dim=-1, keepdim=True) * 0


CHUNK_ELEMENTS = 1 << 18  # features per chunk and CPU thread (1 MB in float32): cache-sized


def chunk_budget(scale: int = 1) -> int:
    """Features per chunk: ``scale`` × :data:`CHUNK_ELEMENTS` per thread, so that each op keeps every thread busy."""
    return CHUNK_ELEMENTS * scale * max(1, torch.get_num_threads())


def head_chunks(B: int, h: int, per_pair: int, device: torch.device, scale: int = 1) -> list[tuple[slice, slice]]:
    """(image, head) index blocks of about :func:`chunk_budget` features; one block on accelerators,
    under ``torch.compile``/``torch.export`` and tracing (the loop would fix the batch size)."""
    if device.type != "cpu" or tracing():
        return [(slice(None), slice(None))]
    budget = chunk_budget(scale)
    if per_pair * h <= budget:  # several images with all their heads
        bc = max(1, budget // (per_pair * h))
        return [(slice(b, b + bc), slice(None)) for b in range(0, B, bc)]
    hc = max(1, budget // per_pair)  # heads of one image
    return [(slice(b, b + 1), slice(j, j + hc)) for b in range(B) for j in range(0, h, hc)]
