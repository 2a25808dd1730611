"""The compiled CPU kernel of :mod:`vitzoo.attention._kernel_core`'s ``"exp"`` feature map (performer's FAVOR+),
``csrc/feature_attention.cpp``.

Paper: Choromanski et al., "Rethinking Attention with Performers", ICLR 2021, https://arxiv.org/abs/2009.14794.

One C++ task per (image, head) walks its tokens in blocks of 64: a block's features ``[64, m]`` are made in cache
(the ``ωx`` product, the shift, exp2) and read there by the products that use them, so no ``[B, h, N, m]``
tensor is written or read back; the keys' stabiliser is a running maximum, so keys are read once. Against the
PyTorch path (token chunks of a few hundred thousand features, each op one pass over memory) it saves the passes
over the chunk and the per-chunk Python. It returns and saves exactly what that path saves, so the two backwards
are interchangeable.

Built on first use and optional (:mod:`vitzoo.attention._cpp`): float32/float64 CPU tensors, one ``ω`` ``[m, d]``
shared by the heads; elsewhere the PyTorch path runs.
"""
from __future__ import annotations

import math
from typing import Optional

from torch import Tensor

from vitzoo.attention import _cpp

STEM = "feature_attention"  # csrc/feature_attention.cpp


def usable(qkv: Tensor, omega: Optional[Tensor], kind: str, factor: float) -> bool:
    """Whether the kernel runs this call: the ``"exp"`` map with one ``ω`` ``[m, d]`` and no constant factor,
    on tensors :func:`vitzoo.attention._cpp.usable` accepts."""
    return (kind == "exp" and omega is not None and omega.dim() == 2 and factor == 1.0
            and _cpp.usable(STEM, qkv, omega))


def _eps(eps: Optional[float]) -> float:
    return -math.inf if eps is None else eps  # no floor: max(den, -inf) = den, and the gradient always passes


def forward(qkv: Tensor, heads: int, omega: Tensor, eps: Optional[float]) -> tuple[Tensor, ...]:
    """``out`` ``[B, N, C]``, ``kvz = φ(K)ᵀ[V | 1]`` ``[B, h, m, d+1]``, the shifts of queries and keys and the
    normalisers (each ``[B, h, N, 1]``), as :func:`vitzoo.attention._kernel_core.kernel_forward` returns them.

    Args:
        qkv: ``[B, N, 3C]`` (float32 or float64).
        heads: h.
        omega: ``[m, d]`` random features.
        eps: floor of the normaliser (None: none).
    """
    ext = _cpp.extension(STEM)
    return tuple(ext.exp_forward(qkv.contiguous(), omega.to(qkv.dtype).contiguous(), heads, _eps(eps)))


def backward(qkv: Tensor, heads: int, omega: Tensor, eps: Optional[float], saved: tuple[Tensor, ...], grad: Tensor,
             dots: Optional[Tensor]) -> Tensor:
    """``∂L/∂qkv`` ``[B, N, 3C]``; the features are recomputed from the saved shifts.

    Args:
        saved: ``(kvz, shift_q, shift_k, den)`` from :func:`forward` (or the PyTorch path's forward).
        grad: ``∂L/∂out`` ``[B, N, C]``.
        dots: ``g·out`` ``[B, h, N, 1]`` from the output forward returned, or None: ``φ(Q)(φ(K)ᵀV)`` is
            recomputed for it.
        others: as :func:`forward`.
    """
    ext = _cpp.extension(STEM)
    saved = [t.contiguous() for t in saved]
    dots = qkv.new_empty(0) if dots is None else dots.to(qkv.dtype).contiguous()
    return ext.exp_backward(qkv.contiguous(), omega.to(qkv.dtype).contiguous(), heads, _eps(eps), *saved,
                            grad.to(qkv.dtype).contiguous(), dots)
