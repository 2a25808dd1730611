"""Random Feature Attention (RFA).

Paper: Peng et al., "Random Feature Attention", ICLR 2021, https://arxiv.org/abs/2103.02143.

Queries and keys are normalised to unit length and scaled, ``u = s∘x̂`` (``s`` one per head and channel,
i.e. ``1/σ``, learned with ``learn_scale`` as the paper learns σ, or fixed; no bound on it). Then ``exp(qᵀk/σ²)``
is proportional to the Gaussian kernel ``exp(-‖u_q - u_k‖²/2)``, which random features estimate from D Gaussian
directions ``ω`` (``attention.num_features``). Attention is ``φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1)``, linear in N.
Two feature maps of the same kernel (``attention.feature_map``):

* ``positive`` (the default): ``φ(u) = exp(ωu - ‖u‖²) / √D``, D features. ``E[φ(u_q)ᵀφ(u_k)] =
  exp(‖u_q + u_k‖²/2 - ‖u_q‖² - ‖u_k‖²) = exp(-‖u_q - u_k‖²/2)``: the positive random features of Choromanski
  et al. (Performer, ICLR 2021) applied to RFA's kernel. Every feature is an exponential, so the normaliser is a
  sum of positive terms: no floor, no clamp, every row's gradient passes. One ``ω [D, d]`` serves every head
  (Performer's layout); the fast path is the PyTorch form of Performer's ``"exp"`` core (not the compiled kernel) on
  ``√2·d^¼·u`` with ``ω/√2`` (the core's ``exp(ω'x̃ - ‖x̃‖²/2)`` of ``x̃ = x/d^¼`` is then ``exp(ωu - ‖u‖²)``), whose
  per-row and per-head stabilisers cancel in the ratio.
* ``trig``: the paper's ``φ(u) = [sin(ωu), cos(ωu)] / √D``, 2D features, one ``ω [D, d]`` per head. Its estimate
  of the normaliser can be ≤ 0; it is floored at ``attention.eps`` (rows at the floor are inflated and their
  normaliser passes no gradient), which the paper does not have.

Departures from the paper: the positive map (a named variant of the same kernel, the default); orthogonal rather
than i.i.d. Gaussian rows; no gate (the paper's gate is for causal decoding; this is the bidirectional form).
``ω`` is a buffer of orthogonal Gaussian rows (same marginals as the paper's i.i.d. rows, lower variance) drawn
from a generator seeded by the layer index, redrawn every ``redraw_interval`` training steps and fixed in eval
(:class:`vitzoo.attention.linear.random_features.RandomFeatureAttention`). A global mixer: prefix tokens (the
class token) are ordinary tokens. ``attn_drop`` is not used.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, check, check_positive_number
from vitzoo.attention.linear.feature_map import feature_core_memory
from vitzoo.attention.linear.random_features import RandomFeatureAttention, check_random_features
from vitzoo.costs import Saved, itemsize
from vitzoo.ops.feature import feature_attention_qkv

FEATURE_MAPS = ("positive", "trig")  # values of attention.feature_map


@dataclass
class RFAConfig:
    num_features: int = 128  # random directions D (positive: D features; trig: a sin and a cos each, 2D)
    feature_map: str = "positive"  # positive: exp(ωu - ‖u‖²)/√D (normaliser > 0); trig: the paper's sin/cos
    learn_scale: bool = True  # learn the per-head, per-channel scale s = 1/σ; false = fixed at `scale`
    scale: float = 1.0  # initial (or fixed) s; the estimated kernel is exp(-‖s∘(q̂ - k̂)‖²/2)
    redraw_interval: int = 1000  # training steps between redraws of ω; 0 = never redraw
    eps: float = 1e-3  # trig only: lower clamp of the normaliser φ(q)ᵀΣφ(k) (positive needs none)

    def __post_init__(self):
        check_random_features(self)
        check(self.feature_map in FEATURE_MAPS,
              f"attention.feature_map must be one of {', '.join(FEATURE_MAPS)} (got {self.feature_map!r})")
        check_positive_number(self, "scale", "eps")


def unit_scaled(x: Tensor, scale: Tensor) -> Tensor:
    """``u = s∘x̂``: ``x[B, h, N, d]`` normalised to unit length, times ``scale`` ``[h, 1, d]``."""
    return F.normalize(x, dim=-1) * scale


def fourier_features(x: Tensor, scale: Tensor, omega: Tensor) -> Tensor:
    """The paper's random Fourier features of ``u = s∘x̂``.

    Args:
        x: queries or keys ``[B, h, N, d]``.
        scale: ``s`` ``[h, 1, d]``.
        omega: ``[h, D, d]``.

    Returns:
        ``φ(u) = [sin(ωu), cos(ωu)] / √D`` ``[B, h, N, 2D]``, so that ``φ(q)ᵀφ(k)`` estimates the kernel itself.
    """
    proj = unit_scaled(x, scale) @ omega.transpose(-2, -1)  # ωu [B, h, N, D]: N·d·D per head
    return torch.cat([proj.sin(), proj.cos()], dim=-1) * omega.shape[-2] ** -0.5  # [B, h, N, 2D]


def positive_features(x: Tensor, scale: Tensor, omega: Tensor) -> Tensor:
    """Positive random features of the same Gaussian kernel (module docstring).

    Args:
        x: queries or keys ``[B, h, N, d]``.
        scale: ``s`` ``[h, 1, d]``.
        omega: ``[D, d]``, shared by the heads.

    Returns:
        ``φ(u) = exp(ωu - ‖u‖²) / √D`` ``[B, h, N, D]``, every entry > 0.
    """
    u = unit_scaled(x, scale)  # [B, h, N, d]
    proj = u @ omega.transpose(-2, -1)  # ωu [B, h, N, D]: N·d·D per head
    return torch.exp(proj - u.square().sum(-1, keepdim=True)) * omega.shape[-2] ** -0.5


@register_attention("rfa", RFAConfig)
class RFAAttention(RandomFeatureAttention):
    """Random Feature Attention; its cost is :attr:`formula` (``positive``; D random directions), ``trig``'s is
    :attr:`trig_formula` (2D features).

    Args:
        cfg: RFAConfig (validated options, see ``configs/attention/rfa.yaml``).
        ctx: dims, heads, grid, prefix tokens and layer index from the host block.
    """

    sequence_capable = True  # the output depends on the tokens as a sequence only
    formula = "4NC² + 4NDC + 2hND"  # positive; the instance's formula follows feature_map
    trig_formula = "4NC² + 2NDC + 4NDC + 4hND"
    feature_symbol = "D"

    def __init__(self, cfg: RFAConfig, ctx: MixerContext):
        trig = cfg.feature_map == "trig"
        # trig: one ω [D, d] per head; positive: one ω [D, d] shared by the heads
        super().__init__(cfg, ctx, lead=(ctx.num_heads,) if trig else (), eps=cfg.eps if trig else None)
        self.feature_kind = "fourier" if trig else "exp"  # the fast path's map (vitzoo.ops.feature)
        self.features_per_row = 2 if trig else 1  # trig: a sin and a cos feature per direction
        if trig:
            self.formula = self.trig_formula
        scale = torch.full((self.num_heads, 1, self.head_dim), float(cfg.scale))  # s [h, 1, d]
        if cfg.learn_scale:
            self.scale_param = nn.Parameter(scale)
        else:
            self.register_buffer("scale_param", scale)

    def feature_map(self, x: Tensor, omega: Tensor, is_query: bool) -> Tensor:
        if self.feature_kind == "fourier":
            return fourier_features(x, self.feature_scale(), omega)
        return positive_features(x, self.feature_scale(), omega)

    def feature_scale(self) -> Tensor:
        """``s`` ``[h, 1, d]``: the parameter itself (learned) or the configured constant."""
        return self.scale_param

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        if self.feature_kind == "fourier":
            return super().forward(x, grid)
        B, N, _ = x.shape
        h, d = self.num_heads, self.head_dim
        qkv = self.qkv(x).view(B, N, 3, h, d)  # [B, N, 3, h, d]
        s = self.feature_scale().squeeze(1)  # [h, d]
        # √2·d^¼·u of q and k: the "exp" core's exp(ω'x̃ - ‖x̃‖²/2), x̃ = x/d^¼, ω' = ω/√2, is exp(ωu - ‖u‖²)
        u = F.normalize(qkv[:, :, :2], dim=-1) * (s * (math.sqrt(2) * d**0.25))  # [B, N, 2, h, d]
        prepared = torch.cat([u, qkv[:, :, 2:]], dim=2).reshape(B, N, 3 * self.dim)  # [B, N, 3C]
        omega = (self.features() * 2**-0.5).expand(h, -1, -1)  # [h, D, d]: the PyTorch core (no compiled kernel)
        out = feature_attention_qkv("exp", prepared, h, omega)  # no floor: the normaliser is positive
        return self.proj_drop(self.proj(out))

    def attend_memory(self, grid: Grid, batch: int, amp: Optional[torch.dtype]) -> list[Saved]:
        if self.feature_kind == "fourier":
            return super().attend_memory(grid, batch, amp)
        n, h, d, D, size = self.seq_len(grid), self.num_heads, self.head_dim, self.cfg.num_features, itemsize(amp)
        # F.normalize of q and k keeps q|k|v (it reads views of it) and two [B, N, 2, h, 1] norms in its dtype
        items = [Saved("q|k|v (projection output)", batch * n * 3 * self.dim, size),  # [B, N, 3C]
                 Saved("q, k norms", batch * n * 2 * h, size), Saved("q, k norms (clamped)", batch * n * 2 * h, size)]
        if self.cfg.learn_scale:  # the scale's gradient reads the unit q̂, k̂ [B, N, 2, h, d]
            items.append(Saved("unit q̂, k̂", batch * n * 2 * self.dim, size))
        # s·√2·d^¼ [h, d] (float32, from s); the core's input in float32 (s promotes it); ω/√2 [D, d] from the buffer
        items += [Saved("scale s·√2·d^¼", h * d, 4), Saved("core input [√2·d^¼·u | V]", batch * n * 3 * self.dim, 4),
                  Saved("ω/√2", D * d, 4)]
        core = feature_core_memory(batch, n, h, d, D, 4, shifts=True)  # its q|k|v is the core input above
        return items + core[1:]
