"""Random Feature Attention (RFA).

Paper: Peng et al., "Random Feature Attention", ICLR 2021, https://arxiv.org/abs/2103.02143.

Queries and keys are normalised to unit length; then ``exp(qᵀk/σ²)`` is proportional to the
Gaussian kernel ``exp(-‖q - k‖²/2σ²)``, which random Fourier features estimate:
``φ(x) = [sin(ωx), cos(ωx)] / √D`` with D Gaussian rows ``ω`` per head, ``φ(q)ᵀφ(k) ≈ exp(-‖s∘(q-k)‖²/2)``.
The scale ``s`` (one per head and channel, i.e. ``1/σ``) is learnable or fixed (``learn_scale``); a learned
one is bounded smoothly by ``max_scale``: ``s = s_max·tanh(θ/s_max)`` of the parameter θ (≈ θ well below the
bound, and the gradient always reaches θ); with ``s`` near 3 the kernel is below ``e⁻⁹`` for most pairs and the
D-feature estimate is mostly noise. Attention is ``φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1)``, linear in N. As q̂ and k̂
are unit vectors, ``‖s∘(q̂ - k̂)‖² <= 4·s_max²``, so the exact normaliser over N keys is at least
``N·exp(-2·s_max²)`` (s_max: ``max_scale`` for a learned s, the fixed s otherwise). The estimate (sin/cos
features can drive it to ≤ 0) is clamped to that bound (``eps: null``, the default): only estimates no exact
kernel could give are clamped, so the floor never hides a possible value and a row can grow at most
``exp(2·s_max²)`` times its largest value. A fixed ``eps`` is an option. This is the non-causal RFA without
the gate (the gate is for causal decoding).

``ω`` is a buffer of orthogonal Gaussian rows (same marginals as the paper's i.i.d. rows, lower
variance) drawn from a generator seeded by the layer index, redrawn every ``redraw_interval``
training steps and fixed in eval (:class:`vitzoo.attention.linear.random_features.RandomFeatureAttention`). A global
mixer: prefix tokens (the class token) are ordinary tokens. ``attn_drop`` is not used.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import MixerContext, check, check_positive_number
from vitzoo.attention.linear.random_features import RandomFeatureAttention, check_random_features


@dataclass
class RFAConfig:
    num_features: int = 128  # random directions D per head; each gives a sin and a cos feature (2D in all)
    learn_scale: bool = True  # learn the per-head, per-channel scale s = 1/σ; false = fixed at `scale`
    scale: float = 1.0  # initial (or fixed) s; the estimated kernel is exp(-‖s∘(q-k)‖²/2)
    redraw_interval: int = 1000  # training steps between redraws of ω; 0 = never redraw
    eps: Optional[float] = None  # lower clamp of φ(q)ᵀΣφ(k); null = the exact kernel's bound N·exp(-2·s_max²)
    max_scale: float = 2.0  # smooth upper bound of s: s = max_scale·tanh(θ/max_scale) of the parameter θ

    def __post_init__(self):
        check_random_features(self)
        check_positive_number(self, "scale", "max_scale", *(() if self.eps is None else ("eps",)))
        check(not self.learn_scale or self.scale < self.max_scale,
              f"attention.scale ({self.scale}) must be below attention.max_scale ({self.max_scale})")


def fourier_features(x: Tensor, scale: Tensor, omega: Tensor) -> Tensor:
    """Random Fourier features of unit-normalised ``x``.

    Args:
        x: queries or keys ``[B, h, N, d]``.
        scale: ``s`` ``[h, 1, d]``.
        omega: ``[h, D, d]``.

    Returns:
        ``φ(x) = [sin(ω(s∘x̂)), cos(ω(s∘x̂))] / √D`` ``[B, h, N, 2D]`` with ``x̂ = x/‖x‖``, so that
        ``φ(q)ᵀφ(k)`` estimates the kernel itself (a value in (0, 1]) and the normaliser is at most N.
    """
    x = F.normalize(x, dim=-1) * scale  # s∘x̂ [B, h, N, d]
    proj = x @ omega.transpose(-2, -1)  # ω(s∘x̂) [B, h, N, D]: N·d·D per head
    return torch.cat([proj.sin(), proj.cos()], dim=-1) * omega.shape[-2] ** -0.5  # [B, h, N, 2D]


@register_attention("rfa", RFAConfig)
class RFAAttention(RandomFeatureAttention):
    """Random Feature Attention; its cost is :attr:`formula` (D random directions, 2D features).

    Args:
        cfg: RFAConfig (validated options, see ``vitzoo/conf/attention/rfa.yaml``).
        ctx: dims, heads, grid, prefix tokens and layer index from the host block.
    """

    formula = "4NC² + 2NDC + 4NDC + 4hND"
    features_per_row = 2  # a sin and a cos feature per direction
    feature_symbol = "D"
    feature_kind = "fourier"

    def __init__(self, cfg: RFAConfig, ctx: MixerContext):
        super().__init__(cfg, ctx, lead=(ctx.num_heads,), eps=cfg.eps)  # one ω [D, d] per head
        theta = cfg.max_scale * math.atanh(cfg.scale / cfg.max_scale) if cfg.learn_scale else cfg.scale
        scale = torch.full((self.num_heads, 1, self.head_dim), float(theta))  # θ (s = cfg.scale at the start) [h, 1, d]
        if cfg.learn_scale:
            self.scale_param = nn.Parameter(scale)
        else:
            self.register_buffer("scale_param", scale)

    def feature_map(self, x: Tensor, omega: Tensor, is_query: bool) -> Tensor:
        return fourier_features(x, self.feature_scale(), omega)

    def feature_scale(self) -> Tensor:
        if not self.cfg.learn_scale:
            return self.scale_param  # a fixed s [h, 1, d], as configured
        bound = self.cfg.max_scale
        return bound * torch.tanh(self.scale_param / bound)  # s [h, 1, d] below the bound, gradient everywhere

    def floor(self, n: int) -> float:
        """``attention.eps``, or the least value the exact normaliser over ``n`` keys can take for any s this layer
        can have, ``n·exp(-2·s_max²)`` (unit q̂, k̂: ``‖s∘(q̂ - k̂)‖² <= 4·s_max²``; s_max = ``max_scale`` for a
        learned s, the fixed s otherwise): a constant of the config, so traced and exported graphs keep it.

        Args:
            n: keys per query.
        """
        if self.cfg.eps is not None:
            return self.cfg.eps
        s_max = self.cfg.max_scale if self.cfg.learn_scale else abs(self.cfg.scale)
        return n * math.exp(-2 * s_max**2)
