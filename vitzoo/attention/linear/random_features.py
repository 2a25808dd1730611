"""Random-feature attention: the common base of ``performer`` and ``rfa``.

Random features live in :class:`RandomFeatures`: a buffer drawn from a generator seeded by the layer index
and a draw counter, redrawn every ``redraw_interval`` training steps and never in eval. Redraws are driven
from outside ``forward``: the training loop calls :func:`vitzoo.attention.before_train_step` once per step
(``VitModule.on_train_batch_start`` does), which calls :meth:`RandomFeatureAttention.before_train_step`, so
``forward`` has no Python-side state and ``torch.compile`` traces it once. The draw depends only on
``(layer_index, step // redraw_interval)``, so every data-parallel rank draws the same features and a
checkpoint (which stores the step count) resumes the same sequence of draws. :class:`RandomFeatureAttention`
holds the feature buffer, the fast and reference attention (:mod:`.feature_map`, :mod:`vitzoo.ops.feature`) and
the cost; a backend adds its feature map.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar, Optional

import torch
from torch import Tensor, nn

from vitzoo.attention.base import Grid, MixerContext, QKVAttention, check_non_negative, check_positive
from vitzoo.attention.linear.feature_map import (
    feature_core_memory,
    feature_map_attention,
    feature_map_attention_flops,
    feature_map_attention_quadratic,
)
from vitzoo.costs import Saved, itemsize
from vitzoo.ops.feature import feature_attention_qkv


def orthogonal_gaussian(rows: int, dim: int, generator: torch.Generator) -> Tensor:
    """``[rows, dim]`` random orthogonal features (Yu et al. 2016; Performer's ORF).

    Rows come in blocks of ``dim`` mutually orthogonal directions (uniform on the sphere), each row
    scaled by a χ(dim) length, so every row is marginally ``N(0, I_dim)``.
    """
    blocks = []
    for _ in range(-(-rows // dim)):
        q, r = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))
        blocks.append((q * r.diagonal().sign()).T)  # Haar-distributed, rows orthonormal [dim, dim]
    lengths = torch.randn(rows, dim, generator=generator, dtype=torch.float64).norm(dim=1, keepdim=True)  # [rows, 1]
    return torch.cat(blocks)[:rows] * lengths


class RandomFeatures(nn.Module):
    """Random projection ``ω`` (``[*lead, m, d]``) kept in a buffer, redrawn during training.

    Calling the module returns the current ``ω`` and changes nothing (so a compiled forward has no
    step-dependent state). :meth:`redraw` counts one training step: at steps ``r, 2r, …``
    (``r = redraw_interval``) it draws a fresh ``ω`` before the step uses it. Eval never redraws.

    Args:
        lead: leading shape, e.g. ``()`` for one projection shared by all heads, ``(h,)`` for one per head.
        num_features: rows m.
        dim: columns d (the head dim).
        seed: the layer index; draw ``i`` uses a generator seeded by ``(seed, i)``.
        redraw_interval: training steps between draws; 0 keeps the first draw forever.
    """

    def __init__(self, lead: tuple[int, ...], num_features: int, dim: int, seed: int, redraw_interval: int):
        super().__init__()
        self.lead, self.num_features, self.dim = tuple(lead), num_features, dim
        self.seed, self.redraw_interval = seed, redraw_interval
        self.register_buffer("weight", self.draw(0).float())
        # training steps seen: a buffer for checkpoints, mirrored in a Python int so that
        # counting never waits on the GPU (re-read after load_state_dict)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self._steps = 0
        self.register_load_state_dict_post_hook(_resync_steps)

    def draw(self, index: int) -> Tensor:
        """The ``index``-th draw of ``ω`` (float64, CPU), a pure function of ``(seed, index)``."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        mats = [orthogonal_gaussian(self.num_features, self.dim, gen) for _ in range(math.prod(self.lead))]
        return torch.stack(mats).reshape(*self.lead, self.num_features, self.dim)  # [*lead, m, d]

    def forward(self) -> Tensor:
        return self.weight

    @torch.no_grad()
    def redraw(self) -> None:
        """Count one training step (call it before the step's forward); draws a fresh ``ω`` when due.

        Does nothing in eval mode or with ``redraw_interval`` 0.
        """
        if not self.training or self.redraw_interval == 0:
            return
        if self._steps > 0 and self._steps % self.redraw_interval == 0:
            self.weight.copy_(self.draw(self._steps // self.redraw_interval))
        self._steps += 1
        self.steps.fill_(self._steps)

    def extra_repr(self) -> str:
        return (f"lead={self.lead}, num_features={self.num_features}, dim={self.dim}, "
                f"redraw_interval={self.redraw_interval}, steps={self._steps}")


def _resync_steps(module: RandomFeatures, incompatible_keys) -> None:
    """After ``load_state_dict``: continue counting from the checkpoint's step."""
    module._steps = int(module.steps)


def check_random_features(cfg: Any) -> None:
    """Options every random-feature config has: ``num_features`` > 0 and ``redraw_interval`` >= 0."""
    check_positive(cfg, "num_features")
    check_non_negative(cfg, "redraw_interval")


class RandomFeatureAttention(QKVAttention):
    """Base of kernel attention with random features (performer, rfa).

    Keeps ``ω`` in ``self.features`` (:class:`RandomFeatures`, ``m = attention.num_features`` rows of
    the head dim, redrawn every ``attention.redraw_interval`` training steps) and computes
    ``φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1)`` with the normaliser clamped to ``eps``. Subclasses implement
    :meth:`feature_map` (for :meth:`attend` and the reference) and name the same map for the fast
    :meth:`forward` (:attr:`feature_kind`, :meth:`feature_scale`, :meth:`feature_factor`; see
    :mod:`vitzoo.ops.feature`, which recomputes the features in backward),
    and set :attr:`features_per_row` (features φ makes from one row of ``ω``)
    and :attr:`feature_symbol` (the name of m in :attr:`formula`).

    Args:
        cfg: the backend's config (``num_features``, ``redraw_interval``).
        ctx: dims, heads, grid, prefix tokens and layer index (the draw's seed) from the host block.
        lead: leading shape of ``ω``: ``()`` shared by the heads, ``(h,)`` one per head.
        eps: lower clamp of the normaliser ``φ(q)ᵀΣφ(k)``.
    """

    linear_cost = True
    features_per_row: ClassVar[int] = 1
    feature_symbol: ClassVar[str] = "m"
    feature_kind: ClassVar[str] = ""  # the fast path's feature map: "exp" or "fourier" (_kernel_core)

    def __init__(self, cfg: Any, ctx: MixerContext, lead: tuple[int, ...], eps: float):
        super().__init__(cfg, ctx)
        self.features = RandomFeatures(lead, cfg.num_features, self.head_dim, ctx.layer_index, cfg.redraw_interval)
        self.eps = eps

    def before_train_step(self) -> None:
        """Count one training step of :attr:`features` and redraw ``ω`` when due (eval mode: nothing)."""
        self.features.redraw()

    def feature_map(self, x: Tensor, omega: Tensor, is_query: bool) -> Tensor:  # pragma: no cover - abstract
        """``φ(x)``: ``x[B, h, N, d]`` -> ``[B, h, N, features_per_row·m]`` (up to factors that cancel)."""
        raise NotImplementedError

    def feature_scale(self) -> Optional[Tensor]:
        """The ``"fourier"`` map's scale ``s`` ``[h, 1, d]`` (None for the others)."""
        return None

    def feature_factor(self) -> float:
        """Constant factor of ``φ(q)ᵀφ(k)`` that the fast path applies to ``φ(K)ᵀ[V | 1]`` instead."""
        return 1.0

    def floor(self, n: int) -> float:
        """The lower clamp of the normaliser ``φ(q)ᵀΣφ(k)`` over ``n`` keys (:attr:`eps` unless overridden).

        Args:
            n: keys per query.
        """
        return self.eps

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        # fused: qkv [B, N, 3C] -> heads merged [B, N, C]; features recomputed in backward, not stored
        omega = self.features()  # the current draw (redraws happen between steps)
        out = feature_attention_qkv(
            self.feature_kind, self.qkv(x), self.num_heads, omega, self.feature_scale(), self.floor(x.shape[1]),
            self.feature_factor(),
        )
        return self.proj_drop(self.proj(out))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        # the per-head form (forward fuses it with the head split and merge): same values
        omega = self.features()
        phi_q, phi_k = self.feature_map(q, omega, True), self.feature_map(k, omega, False)
        return feature_map_attention(phi_q, phi_k, v, self.floor(k.shape[2]))

    def attend_flops(self, grid: Grid) -> int:
        n, m, d = self.seq_len(grid), self.cfg.num_features, self.head_dim
        # feature projections ω·q and ω·k: N·d·m each per head -> 2NmC
        features = 2 * self.num_heads * n * d * m
        # φ(K)ᵀ[V | 1] and φ(Q)·[φ(K)ᵀV | φ(K)ᵀ1] over the features_per_row·m features of φ
        return features + feature_map_attention_flops(self.num_heads, n, self.features_per_row * m, d)

    def attend_memory(self, grid: Grid, batch: int, amp: Optional[torch.dtype]) -> list[Saved]:
        # the fused core (ω, a buffer, and the scale, a parameter, are not activations): q|k|v, φ(K)ᵀ[V | 1] over
        # features_per_row·m features, the normalisers and, for "exp", the two stabilisers
        m = self.features_per_row * self.cfg.num_features
        return feature_core_memory(batch, self.seq_len(grid), self.num_heads, self.head_dim, m, itemsize(amp),
                                   shifts=self.feature_kind == "exp")

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        # explicit kernel matrix φ(Q)φ(K)ᵀ [N, N], then AV / A1 (same clamp)
        omega = self.features.weight
        phi_q, phi_k = self.feature_map(q, omega, True), self.feature_map(k, omega, False)
        return feature_map_attention_quadratic(phi_q, phi_k, v, self.floor(k.shape[2]))

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        return {**super().symbols(grid), self.feature_symbol: self.cfg.num_features}
