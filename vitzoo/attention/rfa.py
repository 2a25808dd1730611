"""Random Feature Attention (RFA).

Paper: Peng et al., "Random Feature Attention", ICLR 2021, https://arxiv.org/abs/2103.02143.

Queries and keys are normalised to unit length; then ``exp(qᵀk/σ²)`` is proportional to the
Gaussian kernel ``exp(-‖q - k‖²/2σ²)``, which random Fourier features estimate:
``φ(x) = [sin(ωx), cos(ωx)] / √D`` with D Gaussian rows ``ω`` per head, ``φ(q)ᵀφ(k) ≈ exp(-‖s∘(q-k)‖²/2)``.
The scale ``s`` (one per head and channel, i.e. ``1/σ``) is learnable or fixed (``learn_scale``).
Attention is ``φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1)``, linear in N; as sin/cos features can make the
normaliser ≤ 0, it is clamped to at least ``eps``. This is the non-causal RFA without the gate
(the gate is for causal decoding).

``ω`` is a buffer of orthogonal Gaussian rows (same marginals as the paper's i.i.d. rows, lower
variance) drawn from a generator seeded by the layer index, redrawn every ``redraw_interval``
training steps and fixed in eval (:class:`vitzoo.attention._kernel.RandomFeatures`). A global
mixer: prefix tokens (the class token) are ordinary tokens. ``attn_drop`` is not used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention._kernel import RandomFeatures, kernel_attention, kernel_attention_flops, kernel_attention_quadratic
from vitzoo.attention.base import Grid, MixerContext, QKVAttention, check, check_positive


@dataclass
class RFAConfig:
    num_features: int = 128  # random directions D per head; each gives a sin and a cos feature (2D in all)
    learn_scale: bool = True  # learn the per-head, per-channel scale s = 1/σ; false = fixed at `scale`
    scale: float = 1.0  # initial (or fixed) s; the estimated kernel is exp(-‖s∘(q-k)‖²/2)
    redraw_interval: int = 1000  # training steps between redraws of ω; 0 = never redraw
    eps: float = 1e-3  # lower clamp of the normaliser φ(q)ᵀΣφ(k)

    def __post_init__(self):
        check_positive(self, "num_features")
        check(isinstance(self.redraw_interval, int) and self.redraw_interval >= 0,
              f"attention.redraw_interval must be a non-negative integer (got {self.redraw_interval!r})")
        check(isinstance(self.scale, (int, float)) and self.scale > 0,
              f"attention.scale must be a positive number (got {self.scale!r})")
        check(isinstance(self.eps, (int, float)) and self.eps > 0, f"attention.eps must be a positive number (got {self.eps!r})")


def fourier_features(x: Tensor, scale: Tensor, omega: Tensor) -> Tensor:
    """Random Fourier features of unit-normalised ``x``.

    Args:
        x: queries or keys ``[B, h, N, d]``.
        scale: ``s`` ``[h, 1, d]``.
        omega: ``[h, D, d]``.

    Returns:
        ``√D·φ(x) = [sin(ω(s∘x̂)), cos(ω(s∘x̂))]`` ``[B, h, N, 2D]`` with ``x̂ = x/‖x‖``; callers
        divide kernel values by D (the ``1/√D`` of φ is left out to save a pass over the features).
    """
    x = F.normalize(x, dim=-1) * scale  # s∘x̂ [B, h, N, d]
    proj = x @ omega.transpose(-2, -1)  # [B, h, N, D]: N·d·D per head
    return torch.cat([proj.sin(), proj.cos()], dim=-1)  # [B, h, N, 2D]


@register_attention("rfa", RFAConfig)
class RFAAttention(QKVAttention):
    """Random Feature Attention. Cost ``4NC² + 2NDC + 4NDC + 4hND``.

    Args:
        cfg: RFAConfig (validated options, see ``configs/attention/rfa.yaml``).
        ctx: dims, heads, grid, prefix tokens and layer index from the host block.
    """

    formula = "4NC² + 2NDC + 4NDC + 4hND"
    linear_cost = True

    def __init__(self, cfg: RFAConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        scale = torch.full((self.num_heads, 1, self.head_dim), float(cfg.scale))  # [h, 1, d]
        if cfg.learn_scale:
            self.scale_param = nn.Parameter(scale)
        else:
            self.register_buffer("scale_param", scale)
        self.features = RandomFeatures((self.num_heads,), cfg.num_features, self.head_dim, ctx.layer_index,
                                       cfg.redraw_interval)
        self.eps = cfg.eps * cfg.num_features  # the clamp on φ(q)ᵀΣφ(k), for features without their 1/√D

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        omega = self.features()  # redraws in training when due
        phi_q, phi_k = fourier_features(q, self.scale_param, omega), fourier_features(k, self.scale_param, omega)
        return kernel_attention(phi_q, phi_k, v, eps=self.eps)

    def attend_flops(self, grid: Grid) -> int:
        n, D, d = self.seq_len(grid), self.cfg.num_features, self.head_dim
        # projections ω·q and ω·k: N·d·D each per head -> 2NDC
        features = 2 * self.num_heads * n * d * D
        # φ(K)ᵀV: N·2D·d, φ(Q)(φ(K)ᵀV): N·2D·d (-> 4NDC), normaliser φ(Q)(φ(K)ᵀ1): N·2D, per head
        return features + kernel_attention_flops(self.num_heads, n, 2 * D, d)

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        # explicit kernel matrix φ(Q)φ(K)ᵀ [N, N], then AV / A1 (same clamp)
        omega = self.features.weight
        phi_q, phi_k = fourier_features(q, self.scale_param, omega), fourier_features(k, self.scale_param, omega)
        return kernel_attention_quadratic(phi_q, phi_k, v, eps=self.eps)

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        return {**super().symbols(grid), "D": self.cfg.num_features}
