"""The compiled CPU kernel of :mod:`vitzoo.ops.feature`'s random features,
``csrc/feature_attention.cpp``:
the ``"exp"`` map (performer's FAVOR+) and the ``"fourier"`` map (rfa).

Papers: Choromanski et al., "Rethinking Attention with Performers", ICLR 2021, https://arxiv.org/abs/2009.14794;
Peng et al., "Random Feature Attention", ICLR 2021, https://arxiv.org/abs/2103.02143.

One C++ task per (image, head) walks its tokens in blocks of 64: a block's features ``[64, m]`` are made in cache
(the ``ωx`` product, then exp2 with the shift, or sin and cos) and read there by the products that use them, so
no ``[B, h, N, m]`` tensor is written or read back; the keys' ``"exp"`` stabiliser is a running maximum, so keys
are read once. Against the PyTorch path (token chunks of a few hundred thousand features, each op one pass over
memory) it saves the passes over the chunk and the per-chunk Python. It returns and saves exactly what that path
saves, so the two backwards are interchangeable.

Built on first use and optional (:mod:`vitzoo.cpu_kernels.loader`): float32/float64 CPU tensors; elsewhere (and for
``"elu"``, whose features are as cheap as the copies) the PyTorch path runs.
"""

from __future__ import annotations

import math
from typing import Optional

from torch import Tensor

from vitzoo.cpu_kernels import loader

STEM = "feature_attention"  # csrc/feature_attention.cpp


def usable(kind: str, qkv: Tensor, omega: Optional[Tensor], scale: Optional[Tensor]) -> bool:
    """Whether the kernel runs this call: ``"exp"`` with one ``ω`` ``[m, d]`` or ``"fourier"`` with ``ω`` ``[h, D, d]``
    and its scale, on tensors :func:`vitzoo.cpu_kernels.loader.usable` accepts."""
    shaped = {
        "exp": omega is not None and omega.dim() == 2,
        "fourier": omega is not None and omega.dim() == 3 and scale is not None,
    }.get(kind, False)
    return shaped and loader.usable(STEM, qkv, omega, scale)


def _eps(eps: Optional[float]) -> float:
    return -math.inf if eps is None else eps  # no floor: max(den, -inf) = den, and the gradient always passes


def _args(kind: str, qkv: Tensor, omega: Tensor, scale: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """``qkv``, ``ω`` and the scale (empty for ``"exp"``) as the kernel takes them: contiguous, in ``qkv``'s dtype."""
    scale = qkv.new_empty(0) if scale is None else scale.detach().to(qkv.dtype).contiguous()
    return qkv.contiguous(), omega.to(qkv.dtype).contiguous(), scale


def forward(
    kind: str, qkv: Tensor, heads: int, omega: Tensor, scale: Optional[Tensor], eps: Optional[float], factor: float
) -> tuple[Optional[Tensor], ...]:
    """``out`` ``[B, N, C]``, ``kvz = factor·φ(K)ᵀ[V | 1]`` ``[B, h, m, d+1]``, the ``"exp"`` shifts of queries and
    keys (``[B, h, N, 1]``; None for ``"fourier"``) and the normalisers ``[B, h, N, 1]``, as
    :func:`vitzoo.ops.feature.feature_core_forward` returns them.

    Args:
        kind: ``"exp"`` or ``"fourier"``.
        qkv: ``[B, N, 3C]`` (float32 or float64).
        heads: h.
        omega: ``[m, d]`` (``"exp"``) or ``[h, D, d]`` (``"fourier"``) random features.
        scale: ``"fourier"``'s ``s`` ``[h, 1, d]`` (None for ``"exp"``).
        eps: floor of the normaliser (None: none).
        factor: constant of ``φ(q)ᵀφ(k)``, applied to ``kvz``.
    """
    out = loader.extension(STEM).feature_forward(
        *_args(kind, qkv, omega, scale), heads, _eps(eps), factor, kind == "fourier"
    )
    return tuple(t if t.numel() else None for t in out)


def backward(
    kind: str,
    qkv: Tensor,
    heads: int,
    omega: Tensor,
    scale: Optional[Tensor],
    eps: Optional[float],
    factor: float,
    saved: tuple[Optional[Tensor], ...],
    grad: Tensor,
    dots: Optional[Tensor],
) -> tuple[Tensor, Optional[Tensor]]:
    """``∂L/∂qkv`` ``[B, N, 3C]`` and ``∂L/∂s`` ``[h, 1, d]`` (None for ``"exp"``); the features are recomputed.

    Args:
        saved: ``(kvz, shift_q, shift_k, den)`` from :func:`forward` (or the PyTorch path's forward).
        grad: ``∂L/∂out`` ``[B, N, C]``.
        dots: ``g·out`` ``[B, h, N, 1]`` from the output forward returned, or None: ``φ(Q)(φ(K)ᵀV)`` is
            recomputed for it.
        others: as :func:`forward`.
    """
    empty = qkv.new_empty(0)
    saved = [empty if t is None else t.contiguous() for t in saved]
    dots = empty if dots is None else dots.to(qkv.dtype).contiguous()
    grad_qkv, grad_scale = loader.extension(STEM).feature_backward(
        *_args(kind, qkv, omega, scale),
        heads,
        _eps(eps),
        factor,
        kind == "fourier",
        *saved,
        grad.to(qkv.dtype).contiguous(),
        dots,
    )
    if scale is None:
        return grad_qkv, None
    return grad_qkv, grad_scale.sum(dim=0).unsqueeze(1).to(scale.dtype)  # Σ over images [h, d] -> [h, 1, d]
