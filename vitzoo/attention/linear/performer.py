"""Performer attention: FAVOR+ with positive orthogonal random features.

Paper: Choromanski et al., "Rethinking Attention with Performers", ICLR 2021,
https://arxiv.org/abs/2009.14794.

The softmax kernel ``exp(qᵀk/√d)`` is estimated by positive random features
``φ(x) = exp(ωx - ‖x‖²/2) / √m`` of ``x = q/d^¼`` (and ``k/d^¼``), with m orthogonal Gaussian rows
``ω`` shared by all heads of the layer. Any constant factor of φ(q) or φ(k) cancels in the ratio, so
the ``1/√m`` is not applied. Attention is ``φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1)``: linear in N,
never N×N. For numerical safety each query's features are divided by their largest value and all
keys' by the largest key feature of the (image, head) (both cancel in the ratio), and the
normaliser is clamped to at least ``1e-6`` so that underflow gives 0, not NaN (the authors' code
adds a small constant to every feature instead; the clamp saves a copy of the N×m features).

``ω`` is a buffer drawn from a generator seeded by the layer index; in training it is redrawn every
``redraw_interval`` training steps (see :class:`vitzoo.attention.linear.random_features.RandomFeatureAttention`); eval
never redraws. A global mixer: prefix tokens (the class token) are ordinary tokens. There are no
attention weights in the fast path, so ``attn_drop`` is not used.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from vitzoo.attention import register_attention
from vitzoo.attention.base import MixerContext
from vitzoo.attention.linear.random_features import RandomFeatureAttention, check_random_features
from vitzoo.ops.exp_shift import ExpShift

NORMALISER_FLOOR = 1e-6  # φ(q)ᵀΣφ(k) is clamped to at least this (it could underflow to 0)


@dataclass
class PerformerConfig:
    num_features: int = 256  # random features m per head (shared ω across heads)
    redraw_interval: int = 1000  # training steps between redraws of ω; 0 = never redraw

    def __post_init__(self):
        check_random_features(self)


def favor_features(x: Tensor, omega: Tensor, is_query: bool) -> Tensor:
    """Positive random features of the softmax kernel.

    Args:
        x: queries or keys ``[B, h, N, d]`` (unscaled).
        omega: random projection ``[m, d]``.
        is_query: stabilise per token (queries) or per (image, head) over all tokens (keys).

    Returns:
        ``φ(x)`` ``[B, h, N, m]`` times a constant per query (queries) or per image and head (keys),
        which cancels in attention.
    """
    x = x * x.shape[-1] ** -0.25  # split 1/√d between q and k
    proj = x @ omega.transpose(-2, -1)  # ωx [B, h, N, m]: N·d·m per head
    half_sq = x.square().sum(dim=-1, keepdim=True) / 2  # ‖x‖²/2 [B, h, N, 1]
    # largest exponent per row is max_m(ωx) - ‖x‖²/2 (the norm is constant along the row), so the
    # stabiliser costs one pass over the features; it is detached and cancels in the ratio
    top = (proj.detach().amax(dim=-1, keepdim=True) - half_sq.detach())  # [B, h, N, 1]
    if not is_query:
        top = top.amax(dim=-2, keepdim=True)  # one constant per (image, head) for keys [B, h, 1, 1]
    return ExpShift.apply(proj, half_sq + top)  # largest feature is exactly 1


@register_attention("performer", PerformerConfig)
class PerformerAttention(RandomFeatureAttention):
    """FAVOR+ attention; its cost is :attr:`formula`.

    Args:
        cfg: PerformerConfig (validated options, see ``configs/attention/performer.yaml``).
        ctx: dims, heads, grid, prefix tokens and layer index from the host block.
    """

    sequence_capable = True  # the output depends on the tokens as a sequence only
    formula = "4NC² + 2NmC + 2NmC + 2hNm"
    feature_kind = "exp"

    def __init__(self, cfg: PerformerConfig, ctx: MixerContext):
        super().__init__(cfg, ctx, lead=(), eps=NORMALISER_FLOOR)  # one ω [m, d] shared by the heads

    def feature_map(self, x: Tensor, omega: Tensor, is_query: bool) -> Tensor:
        return favor_features(x, omega, is_query)
