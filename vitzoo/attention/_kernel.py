"""Shared pieces of the kernel (linearised) attention backends: ``linear``, ``efficient``,
``performer`` and ``rfa``.

Kernel attention replaces ``softmax(qᵀk)`` by a feature-map product ``φ(q)ᵀφ(k)``:

    out_i = Σ_j φ(q_i)ᵀφ(k_j) v_j / Σ_j φ(q_i)ᵀφ(k_j) = φ(q_i)ᵀ(φ(K)ᵀV) / φ(q_i)ᵀ(φ(K)ᵀ1)

:func:`kernel_attention` computes the right-hand side (linear in N, never N×N);
:func:`kernel_attention_quadratic` the left-hand side (the explicit N×N kernel matrix) for references.

Random features (performer, rfa) live in :class:`RandomFeatures`: a buffer drawn from a generator
seeded by the layer index and a draw counter, redrawn every ``redraw_interval`` training steps and
never in eval. Redraws are driven from outside ``forward``: the training loop calls
:func:`redraw_random_features` once per step (``VitModule.on_train_batch_start`` does), so
``forward`` has no Python-side state and ``torch.compile`` traces it once. The draw depends only on ``(layer_index, step // redraw_interval)``, so every
data-parallel rank draws the same features and a checkpoint (which stores the step count)
resumes the same sequence of draws. :class:`RandomFeatureAttention` is their common base: the
feature buffer, the fast and reference attention and the cost; a backend adds its feature map.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitzoo.attention._kernel_core import kernel_attention_qkv
from vitzoo.attention.base import Grid, MixerContext, QKVAttention, check_non_negative, check_positive


def kernel_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, eps: Optional[float] = None) -> Tensor:
    """``φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1)`` in linear time.

    Args:
        phi_q, phi_k: features ``[B, h, N, m]``.
        v: values ``[B, h, N, d]``.
        eps: if given, the normaliser is clamped to at least ``eps`` (feature maps that can go negative).

    The sums over N (``φ(K)ᵀV``, ``φ(K)ᵀ1``) and the normaliser are computed in float32 (float64
    inputs stay float64) even under fp16/bf16 autocast: ``φ(K)ᵀ1`` grows with N and overflows fp16
    (65504) on large grids, and bf16's 8-bit mantissa would round the normaliser. The result has
    ``v``'s dtype.
    """
    acc = torch.promote_types(v.dtype, torch.float32)  # at least float32
    with torch.autocast(v.device.type, enabled=False):
        phi_q, phi_k, v_acc = phi_q.to(acc), phi_k.to(acc), v.to(acc)
        v1 = F.pad(v_acc, (0, 1), value=1.0)  # [V | 1] [B, h, N, d+1]: φ(K)ᵀ1 rides along with φ(K)ᵀV
        kvz = phi_k.transpose(-2, -1) @ v1  # [φ(K)ᵀV | φ(K)ᵀ1] [B, h, m, d+1]: N·m·(d+1) per head
        out = phi_q @ kvz  # [φ(Q)(φ(K)ᵀV) | φ(Q)(φ(K)ᵀ1)] [B, h, N, d+1]: N·m·(d+1) per head
        return (out[..., :-1] / _floor(out[..., -1:], eps)).to(v.dtype)


def kernel_attention_quadratic(phi_q: Tensor, phi_k: Tensor, v: Tensor, eps: Optional[float] = None) -> Tensor:
    """Reference: the explicit kernel matrix ``A = φ(Q)φ(K)ᵀ``, then ``AV / A1`` (materialises N×N).

    Args: as :func:`kernel_attention`.
    """
    a = phi_q @ phi_k.transpose(-2, -1)  # [B, h, N, N], a_ij = φ(q_i)·φ(k_j)
    return (a @ v) / _floor(a.sum(dim=-1, keepdim=True), eps)


def kernel_attention_flops(heads: int, n: int, features: int, head_dim: int) -> int:
    """MACs of :func:`kernel_attention` for one image: ``2·h·N·m·(d+1)``.

    The normaliser is computed by the same matmuls as the numerator (a ones column appended to V),
    one pass over the features instead of two matrix-vector products.
    """
    kvz = n * features * (head_dim + 1)  # φ(K)ᵀ[V | 1]
    out = n * features * (head_dim + 1)  # φ(Q)·[φ(K)ᵀV | φ(K)ᵀ1]
    return heads * (kvz + out)


def _floor(den: Tensor, eps: Optional[float]) -> Tensor:
    return den if eps is None else den.clamp_min(eps)


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


def redraw_random_features(model: nn.Module) -> None:
    """One training step of every :class:`RandomFeatures` in ``model`` (see :meth:`RandomFeatures.redraw`).

    Args:
        model: a network or a single mixer; modules in eval mode are left alone.
    """
    for module in model.modules():
        if isinstance(module, RandomFeatures):
            module.redraw()


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
    :meth:`forward` (:attr:`feature_kind`, :meth:`kernel_scale`, :meth:`kernel_factor`; see
    :mod:`vitzoo.attention._kernel_core`, which recomputes the features in backward), and set :attr:`features_per_row` (features φ makes from one row of ``ω``)
    and :attr:`feature_symbol` (the name of m in :attr:`formula`).

    Args:
        cfg: the backend's config (``num_features``, ``redraw_interval``).
        ctx: dims, heads, grid, prefix tokens and layer index (the draw's seed) from the host block.
        lead: leading shape of ``ω``: ``()`` shared by the heads, ``(h,)`` one per head.
        eps: lower clamp of the normaliser ``φ(q)ᵀΣφ(k)``.
    """

    family = "kernel"
    linear_cost = True
    features_per_row: ClassVar[int] = 1
    feature_symbol: ClassVar[str] = "m"
    feature_kind: ClassVar[str] = ""  # the fast path's feature map: "exp" or "fourier" (_kernel_core)

    def __init__(self, cfg: Any, ctx: MixerContext, lead: tuple[int, ...], eps: float):
        super().__init__(cfg, ctx)
        self.features = RandomFeatures(lead, cfg.num_features, self.head_dim, ctx.layer_index, cfg.redraw_interval)
        self.eps = eps

    def feature_map(self, x: Tensor, omega: Tensor, is_query: bool) -> Tensor:  # pragma: no cover - abstract
        """``φ(x)``: ``x[B, h, N, d]`` -> ``[B, h, N, features_per_row·m]`` (up to factors that cancel)."""
        raise NotImplementedError

    def kernel_scale(self) -> Optional[Tensor]:
        """The ``"fourier"`` map's scale ``s`` ``[h, 1, d]`` (None for the others)."""
        return None

    def kernel_factor(self) -> float:
        """Constant factor of ``φ(q)ᵀφ(k)`` that the fast path applies to ``φ(K)ᵀ[V | 1]`` instead."""
        return 1.0

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        # fused: qkv [B, N, 3C] -> heads merged [B, N, C]; features recomputed in backward, not stored
        omega = self.features()  # the current draw (redraws happen between steps)
        out = kernel_attention_qkv(self.feature_kind, self.qkv(x), self.num_heads, omega, self.kernel_scale(),
                                   self.eps, self.kernel_factor())
        return self.proj_drop(self.proj(out))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        # the per-head form (forward fuses it with the head split and merge): same values
        omega = self.features()
        return kernel_attention(self.feature_map(q, omega, True), self.feature_map(k, omega, False), v, self.eps)

    def attend_flops(self, grid: Grid) -> int:
        n, m, d = self.seq_len(grid), self.cfg.num_features, self.head_dim
        # feature projections ω·q and ω·k: N·d·m each per head -> 2NmC
        features = 2 * self.num_heads * n * d * m
        # φ(K)ᵀ[V | 1] and φ(Q)·[φ(K)ᵀV | φ(K)ᵀ1] over the features_per_row·m features of φ
        return features + kernel_attention_flops(self.num_heads, n, self.features_per_row * m, d)

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        # explicit kernel matrix φ(Q)φ(K)ᵀ [N, N], then AV / A1 (same clamp)
        omega = self.features.weight
        phi_q, phi_k = self.feature_map(q, omega, True), self.feature_map(k, omega, False)
        return kernel_attention_quadratic(phi_q, phi_k, v, self.eps)

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        return {**super().symbols(grid), self.feature_symbol: self.cfg.num_features}
