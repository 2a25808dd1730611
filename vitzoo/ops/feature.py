"""The fast path of kernel attention: ``φ(Q)(φ(K)ᵀ[V | 1])`` from ``qkv`` to merged heads in one autograd node.

Autograd through the plain expression keeps every ``[B, h, N, m]`` tensor it meets (projections,
features, their exponentials) alive until backward: several times the memory of q, k and v, and
several passes over memory that is far larger than the caches. :class:`FeatureAttentionCore` takes the
fused projection ``qkv[B, N, 3C]`` and returns ``[B, N, C]`` (no head split/merge copies), saves
only ``qkv``, ``φ(K)ᵀ[V | 1]`` ``[B, h, m, d+1]``, the normalisers and the ``"exp"`` stabilisers
``[B, h, N, 1]``, takes ``g·out`` from the output it returned (released after that one pass), recomputes
the features in backward, and works through (image, head)
pairs and token blocks of about :data:`CHUNK_ELEMENTS` features per thread (:data:`FEATURE_CHUNK_SCALE`
times that for random features), so that a block's features stay in cache between the exponential and
the matmuls that read them.
:mod:`vitzoo.ops.efficient` does the same for Efficient Attention's two softmaxes.

Feature maps (``kind``), of prepared inputs ``x`` (q and k scaled or normalised chunk by chunk):

* ``"exp"`` (performer; rfa's positive map on the inputs it prepares): ``φ(x) = exp(ωx - ‖x‖²/2 - c)`` of
  ``x = q/d^¼`` with ``c`` the largest exponent
  of the query's row (queries) or of all keys of the (image, head) (keys); ``c`` is a constant of autograd.
  The ``1/d^¼`` is folded into ω and ``‖x‖²``, so that q and k are read in place (no scaled copy).
* ``"fourier"`` (rfa's trig map): ``φ(x) = [sin ωx, cos ωx]`` of ``x = s∘q/‖q‖``; the ``1/√D`` of both φ's is
  the ``factor`` 1/D.
* ``"elu"`` (linear): ``φ(x) = elu(x) + 1`` (no ω).

Gradients are those of the plain expression (checked by ``gradcheck`` in the tests). Features and
sums are computed in float32 (float64 stays float64) with autocast off; the output has ``qkv``'s dtype.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from vitzoo.cpu_kernels import feature_kernel
from vitzoo.ops.common import LOG2E, chunk_budget, head_chunks, tracing
from vitzoo.ops.dispatch import select

# Random features (performer, rfa: m ≫ d per token) take chunks this many times larger: on a 2-core AMD EPYC
# (Zen 2) a 4,096-token performer layer trains 9% (rfa 14%) faster, its live peak 87 MB instead of 85 MB
# (global: 91 MB); elu features (m = d) gain nothing and efficient/linear would need more than global.
FEATURE_CHUNK_SCALE = 2


def _chunk_scale(omega: Optional[Tensor]) -> int:
    """Chunk scale of a feature map: :data:`FEATURE_CHUNK_SCALE` with random features ``omega``, else 1."""
    return 1 if omega is None else FEATURE_CHUNK_SCALE


def _rows(N: int, per_row: int, device: torch.device, scale: int = 1) -> list[slice]:
    """Token blocks of about :func:`chunk_budget` features (``per_row`` features per token); one block
    where :func:`head_chunks` gives one."""
    if device.type != "cpu" or tracing() or N * per_row <= chunk_budget(scale):
        return [slice(None)]
    n = max(1, chunk_budget(scale) // per_row)
    return [slice(i, i + n) for i in range(0, N, n)]


def _omega(omega: Optional[Tensor], heads: slice) -> Optional[Tensor]:
    """This chunk's ω: ``[m, d]`` shared by the heads, or ``[h, m, d]`` cut to the chunk's heads."""
    return omega if omega is None or omega.dim() == 2 else omega[heads]


def _features(kind: str, x: Tensor, omega: Optional[Tensor], shift: Optional[Tensor],
              query: bool) -> tuple[Tensor, Optional[Tensor]]:
    """``φ(x)`` ``[b, h, N, m]`` of ``x[b, h, N, d]`` and the ``"exp"`` stabiliser ``[b, h, N, 1]`` in log2 units
    (computed when ``shift`` is None, else reused: backward recomputes the forward's features)."""
    if kind == "elu":
        return F.elu(x).add_(1), None
    if kind == "exp":  # ω(x/d^¼) in log2 units (exp2 is the fast exponential, LOG2E): stabilisers in log2 units too
        omega = omega * (LOG2E * _exp_scale(x))
    proj = x @ omega.transpose(-2, -1)  # ωx [b, h, N, m]: N·d·m per head
    if kind == "fourier":  # sin over [ωx | ωx + π/2] = [sin ωx | cos ωx]: one contiguous pass
        if proj.requires_grad or torch.compiler.is_compiling():  # traced with autograd on: no out= there
            return torch.cat([proj, proj + math.pi / 2], dim=-1).sin(), None
        D = proj.shape[-1]
        phi = proj.new_empty(*proj.shape[:-1], 2 * D)  # [b, h, n, 2D]
        phi[..., :D] = proj
        torch.add(proj, math.pi / 2, out=phi[..., D:])
        return phi.sin_(), None
    if shift is None:
        top = proj.amax(dim=-1, keepdim=True)  # [b, h, N, 1]
        if query:  # ‖x‖²/2 is constant along the row: the shift is just the row's largest ωx
            shift = top
        else:  # ‖x‖²/2 + the largest exponent over all keys of the (image, head)
            half_sq = x.square().sum(dim=-1, keepdim=True).mul_(0.5 * LOG2E * _exp_scale(x) ** 2)  # [b, h, N, 1]
            shift = half_sq + (top - half_sq).amax(dim=-2, keepdim=True)
    return proj.sub_(shift).exp2_(), shift  # largest query feature (or key feature) is exactly 1


def _features_backward(kind: str, grad_phi: Tensor, phi: Tensor, x: Tensor, omega: Optional[Tensor],
                       grad_half_sq: Optional[Tensor]) -> Tensor:
    """``∂L/∂x`` from ``∂L/∂φ`` (overwritten) and the recomputed ``φ``; ``grad_half_sq`` ``[b, h, N, 1]``
    is ``∂L/∂(‖x̃‖²/2)`` for ``"exp"`` (the row sum of ``∂L/∂φ ⊙ φ`` with a minus sign)."""
    if kind == "elu":
        return grad_phi.mul_(phi.clamp_(max=1))  # d(elu+1)/dx: 1 for x > 0, exp(x) = φ for x ≤ 0
    if kind == "fourier":
        D = phi.shape[-1] // 2
        grad_proj = grad_phi[..., :D].mul_(phi[..., D:])  # d sin = cos
        grad_proj.addcmul_(grad_phi[..., D:], phi[..., :D], value=-1)  # d cos = -sin
        return grad_proj @ omega
    grad_proj = grad_phi.mul_(phi)  # d exp(u) = exp(u) du [b, h, N, m]
    c = _exp_scale(x)  # of x̃ = c·x: ∂L/∂x = c·ω ∂L/∂(ωx̃) + c²·x ∂L/∂(‖x̃‖²/2)
    return (grad_proj @ (omega * c)).addcmul_(grad_half_sq, x, value=c * c)


def _exp_scale(x: Tensor) -> float:
    """``1/d^¼``: ``"exp"`` takes ``x/d^¼`` (with k's, ``1/√d`` of the scores), folded into ω and ``‖x‖²``."""
    return x.shape[-1] ** -0.25


def _floor(den: Tensor, eps: Optional[float]) -> Tensor:
    return den if eps is None else den.clamp_min(eps)


def _normalise_backward(g_o: Tensor, dot: Tensor, den_raw: Tensor, eps: Optional[float],
                        with_half: bool) -> tuple[Tensor, Optional[Tensor]]:
    """Gradients through ``out = φ(Q)kv / max(φ(Q)z, eps)`` of a query block.

    Args:
        g_o: ``∂L/∂out`` ``[b, h, n, d]``.
        dot: ``g·out`` per query ``[b, h, n, 1]``.
        den_raw: ``φ(Q)z`` ``[b, h, n, 1]`` before the floor.
        eps: the floor (None: none).
        with_half: also return ``∂L/∂(‖x‖²/2) = -Σ_e ∂L/∂qkvz·qkvz`` (``"exp"``; 0 unless floored).

    Returns:
        ``∂L/∂[φ(Q)kv | φ(Q)z]`` ``[b, h, n, d+1]`` and the ``"exp"`` term ``[b, h, n, 1]`` (or None).
    """
    den = _floor(den_raw, eps)
    grad_den = -dot / den  # ∂L/∂(φ(Q)z) = -(g·out)/den
    if eps is not None:
        grad_den = grad_den * (den_raw >= eps)  # clamp_min passes the gradient where not clamped
    grad_qkvz = torch.cat([g_o / den, grad_den], dim=-1)  # ∂L/∂(φ(Q)kv) = g/den
    return grad_qkvz, (-(dot + grad_den * den_raw) if with_half else None)  # Σ ∂L/∂(φ(Q)kv)·φ(Q)kv = g·out


def _output_dots(ctx, grad: Tensor, heads: int) -> Optional[Tensor]:
    """``[B, h, N, 1]``: ``g·out`` per query and head from :class:`FeatureAttentionCore`'s output ``ctx.out``,
    which this releases.

    Backward then needs no ``φ(Q)[kv | z]`` (an ``N·m·(d+1)`` product per head). The output projection saves
    the same output for its weight gradient and frees it when its backward has run, before this one; held
    here through the whole backward it would be extra memory at the live peak, so it is released after
    this pass (a temporary of one image at a time). None (recompute ``φ(Q)[kv | z]``): no output kept
    (a low-precision one, or a second backward of a retained graph) or the output was changed in place.
    """
    out, ctx.out = ctx.out, None
    if out is None or out._version != ctx.out_version:
        return None
    B, N, C = out.shape
    dots = out.new_empty(B, N, heads)
    g4, o4 = grad.reshape(B, N, heads, C // heads), out.view(B, N, heads, C // heads)
    for i in range(B):
        dots[i] = (g4[i].to(out.dtype) * o4[i]).sum(dim=-1)  # [N, h]
    return dots.transpose(1, 2).unsqueeze(-1)  # [B, N, h] -> [B, h, N, 1]


def _prepare(
    kind: str, x: Tensor, scale: Optional[Tensor], acc: torch.dtype
) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """A chunk of q or k ``[b, h, N, d]`` as the feature map takes it: ``x`` itself in ``acc`` (``"exp"``, whose
    1/d^¼ :func:`_features` folds into ω; read, never changed), contiguous copies in ``acc`` of ``s∘x/‖x‖``
    (``"fourier"``, also returning ``x/‖x‖`` and ``‖x‖``) or ``x`` (``"elu"``)."""
    if kind == "exp":
        return x.to(acc), None, None
    xt = torch.empty(x.shape, dtype=acc, device=x.device).copy_(x)  # a fresh copy: safe to change in place
    if kind == "fourier":
        norm = xt.norm(dim=-1, keepdim=True).clamp_min_(1e-12)  # as F.normalize [b, h, N, 1]
        unit = xt.div_(norm)
        return unit * scale.to(acc), unit, norm
    return xt, None, None


def _input_grad(
    kind: str,
    grad_phi: Tensor,
    phi: Tensor,
    x: Tensor,
    omega: Optional[Tensor],
    half: Optional[Tensor],
    unit: Optional[Tensor],
    norm: Optional[Tensor],
    scale: Optional[Tensor],
) -> tuple[Tensor, Optional[Tensor]]:
    """``∂L/∂x`` ``[b, n, h, d]`` (token-major, as stored in ``∂L/∂qkv``) and ``∂L/∂s`` of queries or keys
    from ``∂L/∂φ``: :func:`_features_backward` then :func:`_prepare_backward`."""
    grad_x = _features_backward(kind, grad_phi, phi, x, omega, half)
    grad_x, grad_scale = _prepare_backward(kind, grad_x, unit, norm, scale)
    return grad_x.transpose(1, 2), grad_scale


def _prepare_backward(
    kind: str, grad: Tensor, unit: Optional[Tensor], norm: Optional[Tensor], scale: Optional[Tensor]
) -> tuple[Tensor, Optional[Tensor]]:
    """``∂L/∂x`` of :func:`_prepare` from ``∂L/∂x̃`` (overwritten), and ``∂L/∂s`` ``[h, 1, d]`` for ``"fourier"``."""
    if kind == "fourier":
        grad_scale = (grad * unit).sum(dim=(0, 2)).unsqueeze(1)  # Σ over images and tokens [h, 1, d]
        grad_unit = grad.mul_(scale.to(grad.dtype))
        radial = (grad_unit * unit).sum(dim=-1, keepdim=True)  # x̂·∂L/∂x̂ [b, h, N, 1]
        return grad_unit.addcmul_(unit, radial, value=-1).div_(norm), grad_scale  # (I - x̂x̂ᵀ)/‖x‖
    return grad, None


class FeatureAttentionCore(torch.autograd.Function):
    """``φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1)`` from the fused projection ``qkv[B, N, 3C]`` to ``out[B, N, C]``,
    saving ``qkv`` and small results, not the features (module docstring). Arguments as
    :func:`feature_attention_qkv`.
    """

    @staticmethod
    def forward(
        ctx,
        kind: str,
        qkv: Tensor,
        heads: int,
        omega: Optional[Tensor],
        scale: Optional[Tensor],
        eps: Optional[float],
        factor: float,
    ) -> Tensor:
        with torch.autocast(qkv.device.type, enabled=False):
            out, kvz, shift_q, shift_k, den = feature_core_forward(kind, qkv, heads, omega, scale, eps, factor)
        ctx.kind, ctx.heads, ctx.eps, ctx.factor = kind, heads, eps, factor
        ctx.save_for_backward(qkv, omega, scale, kvz, shift_q, shift_k, den)
        # the output as computed (accumulation dtype only), held outside autograd's saved tensors so that
        # backward can release it after one pass (see _output_dots); its version detects in-place changes
        keep = ctx.needs_input_grad[1] and out.dtype == kvz.dtype and not out.is_inference()
        ctx.out, ctx.out_version = (out.detach(), out._version) if keep else (None, None)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        qkv, omega, scale, kvz, shift_q, shift_k, den = ctx.saved_tensors
        kind, heads, eps, factor = ctx.kind, ctx.heads, ctx.eps, ctx.factor
        dots = _output_dots(ctx, grad, heads)  # [B, h, N, 1] g·out, or None: φ(Q)[kv | z] recomputed
        if select("feature_attention", kind, qkv, omega, scale) == "cpu_kernel":  # compiled; either forward's results
            grad_qkv, grad_scale = feature_kernel.backward(
                kind, qkv, heads, omega, scale, eps, factor, (kvz, shift_q, shift_k, den), grad, dots
            )
            return None, grad_qkv, None, None, grad_scale, None, None
        B, N, C3 = qkv.shape
        d, acc = C3 // 3 // heads, kvz.dtype
        omega = None if omega is None else omega.to(acc)
        grad_qkv = torch.empty_like(qkv, memory_format=torch.contiguous_format)
        grad_scale = None if scale is None else torch.zeros(scale.shape, dtype=acc, device=qkv.device)
        g5, q5, o5 = grad_qkv.view(B, N, 3, heads, d), qkv.reshape(B, N, 3, heads, d), grad.reshape(B, N, heads, d)
        with torch.autocast(qkv.device.type, enabled=False):
            m, wide = kvz.shape[-2], _chunk_scale(omega)
            for b, j in head_chunks(B, heads, N * m, qkv.device, wide):
                w, s = _omega(omega, j), None if scale is None else scale[j]
                kvz_c = kvz[b, j]  # [b, h, m, d+1]
                # token blocks (the stabilisers are saved) holding two [n, m] blocks at once: φ and ∂L/∂φ
                rows = _rows(N, 2 * kvz_c.shape[0] * kvz_c.shape[1] * m, qkv.device, wide)
                g_kvz = None
                for r in rows:  # queries: features recomputed
                    xq, unit, norm = _prepare(kind, q5[b, r, 0, j].transpose(1, 2), s, acc)  # [b, h, n, d]
                    phi_q, _ = _features(kind, xq, w, None if shift_q is None else shift_q[b, j, r], True)
                    den_raw, g_o = den[b, j, r], o5[b, r, j].transpose(1, 2).to(acc)  # φ(Q)z [b, h, n, 1], ∂L/∂out
                    if dots is None:  # g·out from [φ(Q)kv | φ(Q)z] recomputed as in forward
                        qkvz_c = phi_q @ kvz_c  # [b, h, n, d+1]
                        dot = (g_o * qkvz_c[..., :d]).sum(dim=-1, keepdim=True).div_(_floor(den_raw, eps))
                        del qkvz_c
                    else:
                        dot = dots[b, j, r]
                    grad_qkvz, half = _normalise_backward(g_o, dot, den_raw, eps, kind == "exp")  # [b, h, n, d+1]
                    del g_o, dot
                    g = phi_q.transpose(-2, -1) @ grad_qkvz  # [b, h, m, d+1]
                    g_kvz = g if g_kvz is None else g_kvz.add_(g)
                    g5[b, r, 0, j], gs = _input_grad(
                        kind, grad_qkvz @ kvz_c.transpose(-2, -1), phi_q, xq, w, half, unit, norm, s
                    )
                    if gs is not None:
                        grad_scale[j] += gs
                    del xq, unit, norm, phi_q, den_raw, grad_qkvz  # freed before the next block's
                if factor != 1.0:
                    g_kvz *= factor
                for r in rows:  # keys and values
                    xk, unit, norm = _prepare(kind, q5[b, r, 1, j].transpose(1, 2), s, acc)
                    phi_k, _ = _features(kind, xk, w, None if shift_k is None else shift_k[b, j, r], False)
                    v1 = F.pad(q5[b, r, 2, j].transpose(1, 2).to(acc), (0, 1), value=1.0)  # [V | 1] [b, h, n, d+1]
                    t = phi_k @ g_kvz  # [b, h, n, d+1]: ∂L/∂V, and the row sums of ∂L/∂φ(k)·φ(k) below
                    g5[b, r, 2, j] = t[..., :d].transpose(1, 2)
                    half = -(v1 * t).sum(dim=-1, keepdim=True) if kind == "exp" else None
                    g5[b, r, 1, j], gs = _input_grad(
                        kind, v1 @ g_kvz.transpose(-2, -1), phi_k, xk, w, half, unit, norm, s
                    )
                    if gs is not None:
                        grad_scale[j] += gs
                    del xk, unit, norm, phi_k, v1, t  # freed before the next block's
        if grad_scale is not None:
            grad_scale = grad_scale.to(scale.dtype)
        return None, grad_qkv, None, None, grad_scale, None, None


def feature_core_forward(
    kind: str,
    qkv: Tensor,
    heads: int,
    omega: Optional[Tensor],
    scale: Optional[Tensor],
    eps: Optional[float],
    factor: float,
) -> tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
    """Forward without autograd: ``out`` ``[B, N, C]`` and what backward needs.

    Args: as :func:`feature_attention_qkv`.

    Returns:
        ``out`` (``qkv``'s dtype), ``kvz = factor·φ(K)ᵀ[V | 1]`` ``[B, h, m, d+1]`` (float32 or
        float64), the ``"exp"`` stabilisers of q and k ``[B, h, N, 1]`` and the normalisers ``φ(Q)z``
        ``[B, h, N, 1]`` before the floor.
    """
    if select("feature_attention", kind, qkv, omega, scale) == "cpu_kernel":  # the compiled kernel, same results
        return feature_kernel.forward(kind, qkv, heads, omega, scale, eps, factor)
    B, N, C3 = qkv.shape
    d, acc = C3 // 3 // heads, torch.promote_types(qkv.dtype, torch.float32)
    m = d if omega is None else omega.shape[-2] * (2 if kind == "fourier" else 1)
    kvz = qkv.new_empty(B, heads, m, d + 1, dtype=acc)
    out = qkv.new_empty(B, N, heads * d)
    q5, o5 = qkv.reshape(B, N, 3, heads, d), out.view(B, N, heads, d)
    omega = None if omega is None else omega.to(acc)
    shifts = [qkv.new_empty(B, heads, N, 1, dtype=acc) for _ in range(2)] if kind == "exp" else [None, None]
    den = qkv.new_empty(B, heads, N, 1, dtype=acc)
    wide = _chunk_scale(omega)
    for b, j in head_chunks(B, heads, N * m, qkv.device, wide):
        w, s = _omega(omega, j), None if scale is None else scale[j]
        xk = _prepare(kind, q5[b, :, 1, j].transpose(1, 2), s, acc)[0]  # [b, h, N, d]
        phi_k, shift_k = _features(kind, xk, w, None, False)  # [b, h, N, m]
        v1 = F.pad(q5[b, :, 2, j].transpose(1, 2).to(acc), (0, 1), value=1.0)  # [V | 1] [b, h, N, d+1]
        kvz_c = phi_k.transpose(-2, -1) @ v1  # [φ(K)ᵀV | φ(K)ᵀ1] [b, h, m, d+1]: N·m·(d+1)
        del phi_k
        if factor != 1.0:
            kvz_c = kvz_c * factor
        kvz[b, j] = kvz_c
        if shift_k is not None:
            shifts[1][b, j] = shift_k
        for r in _rows(N, kvz_c.shape[0] * kvz_c.shape[1] * m, qkv.device, wide):  # queries in token blocks
            xq = _prepare(kind, q5[b, r, 0, j].transpose(1, 2), s, acc)[0]  # [b, h, n, d]
            phi_q, shift_q = _features(kind, xq, w, None, True)
            qkvz_c = phi_q @ kvz_c  # [φ(Q)kv | φ(Q)z] [b, h, n, d+1]: N·m·(d+1) in all
            o5[b, r, j] = (qkvz_c[..., :d] / _floor(qkvz_c[..., d:], eps)).transpose(1, 2)
            den[b, j, r] = qkvz_c[..., d:]
            if shift_q is not None:
                shifts[0][b, j, r] = shift_q
    return out, kvz, shifts[0], shifts[1], den


def feature_attention_qkv(
    kind: str,
    qkv: Tensor,
    heads: int,
    omega: Optional[Tensor] = None,
    scale: Optional[Tensor] = None,
    eps: Optional[float] = None,
    factor: float = 1.0,
) -> Tensor:
    """``φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1)`` per head, from the fused projection to the merged heads.

    Features and sums are computed in float32 (float64 stays float64) even under fp16/bf16 autocast:
    ``φ(K)ᵀ1`` grows with N and overflows fp16 on large grids, and bf16's 8-bit mantissa would round
    the features and the normaliser. Gradients are those of the plain expression; a plain forward
    (no autograd.Function) when tracing with ``torch.jit.trace``, which cannot record one.

    Args:
        kind: ``"exp"``, ``"fourier"`` or ``"elu"`` (module docstring).
        qkv: ``[B, N, 3C]``, q, k and v side by side, heads ``[h, d]`` within each.
        heads: h.
        omega: ``[m, d]`` shared by the heads or ``[h, m, d]`` (None for ``"elu"``).
        scale: ``"fourier"``'s ``s`` ``[h, 1, d]``.
        eps: lower clamp of the normaliser (None: no clamp).
        factor: constant of ``φ(q)ᵀφ(k)`` (rfa's 1/D), applied to the small ``φ(K)ᵀ[V | 1]`` instead.

    Returns:
        ``out`` ``[B, N, C]`` (heads merged) in ``qkv``'s dtype.
    """
    if select("fused_qkv") == "plain_forward":
        return feature_core_forward(kind, qkv, heads, omega, scale, eps, factor)[0]
    return FeatureAttentionCore.apply(kind, qkv, heads, omega, scale, eps, factor)
