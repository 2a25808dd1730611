"""Linformer: keys and values projected along the sequence from N to k.

Paper: Wang et al., "Linformer: Self-Attention with Linear Complexity", 2020,
https://arxiv.org/abs/2006.04768.

``head_i = softmax(Q_i (E_i K_i)ᵀ/√d) (F_i V_i)`` with learned ``E_i, F_i ∈ R^{k×N}``. Sharing
(``sharing``, the paper's §4 options): ``none`` (an E and an F per head), ``headwise`` (one E and
one F for all heads of the layer), ``kv`` (one matrix for keys, values and all heads). The paper's
layerwise sharing (one matrix for the whole network) is not offered: each block owns its mixer.

Prefix tokens (the class token) are projected along with the grid tokens: E and F have
``P + H·W`` columns, and every token, class token included, queries the k projected tokens.
``k`` larger than N is clamped to N (no compression to gain).

The projections depend on N, so the mixer is fixed-length (``fixed_length = True``): another grid
is an error unless ``interpolate: true``, which resamples the grid columns of E/F bilinearly as an
image (:func:`vitzoo.attention.functional.resample_tokens`, prefix columns kept) and multiplies them by
``H·W / H'·W'`` so a projected token keeps its magnitude when the grid grows or shrinks.

The fast path (:class:`vitzoo.ops.linformer.LinformerCore`) goes from the fused projection ``qkv[B, N, 3C]`` to merged
heads in one autograd node that saves only ``qkv`` and ``E``, ``F``: the projected keys and values
and the ``[N, k]`` probabilities are recomputed in backward chunk by chunk, and the gradients of q, k
and v are written straight into one ``[B, N, 3C]`` buffer (no copies of q, k, v, no stacked
gradients). With attention dropout in training the per-head form (:meth:`attend`, SDPA) is used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, QKVAttention, check, check_positive
from vitzoo.attention.functional import dense_attention, resample_tokens, sdpa, sdpa_flops
from vitzoo.costs import Saved, itemsize
from vitzoo.ops.linformer import linformer_attention_qkv

SHARING = ("none", "headwise", "kv")


@dataclass
class LinformerConfig:
    k: int = 32  # projected sequence length (clamped to N)
    sharing: str = "none"  # none: E, F per head; headwise: one E, one F per layer; kv: one matrix per layer
    interpolate: bool = False  # at another grid resample E/F (true) or raise a ConfigError (false)

    def __post_init__(self):
        check_positive(self, "k")
        check(self.sharing in SHARING, f"attention.sharing must be one of {', '.join(SHARING)} (got {self.sharing!r})")


@register_attention("linformer", LinformerConfig)
class LinformerAttention(QKVAttention):
    """Attention over k sequence-projected keys/values; its cost is :attr:`formula`.

    Args:
        cfg: LinformerConfig (validated options, see ``configs/attention/linformer.yaml``).
        ctx: dims, heads, grid, prefix tokens and layer index from the host block.
    """

    formula = "4NC² + 4NkC"  # plus 4·(E/F entries) for resampling when run at another grid
    linear_cost = True
    fixed_length = True

    def __init__(self, cfg: LinformerConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        n = self.seq_len()
        self.k = min(cfg.k, n)
        mats = 1 if cfg.sharing == "kv" else 2
        heads = self.num_heads if cfg.sharing == "none" else 1
        # [E/F, heads, N, k]: E_i (k×N in the paper) is seq_proj[0, i].T
        self.seq_proj = nn.Parameter(torch.empty(mats, heads, n, self.k))
        self.init_weights()

    def init_weights(self) -> None:
        """Normal with std 1/√N: a projected token has the magnitude of one input token."""
        nn.init.normal_(self.seq_proj, std=self.seq_len() ** -0.5)

    def projections(self, grid: Grid) -> tuple[Tensor, Tensor]:
        """``(E, F)`` for ``grid``, each ``[heads, N, k]`` (heads = h or 1), resampled if needed."""
        proj = self.projection_weights(grid)
        return proj[0], proj[-1]

    def projection_weights(self, grid: Grid) -> Tensor:
        """E and F for ``grid`` stacked ``[mats, heads, N, k]`` (``seq_proj`` itself at the build grid)."""
        self.check_grid(grid)
        proj = self.seq_proj
        if tuple(grid) != self.grid:
            P = self.num_prefix
            proj = resample_tokens(proj, self.grid, grid, P, dim=-2)  # [mats, heads, N', k]
            area = (self.grid[0] * self.grid[1]) / (grid[0] * grid[1])
            proj = torch.cat([proj[..., :P, :], proj[..., P:, :] * area], dim=-2)
        return proj

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        if self.training and self.attn_drop.p > 0:
            return super().forward(x, grid)  # dropout on the probabilities: the per-head form
        proj = self.projection_weights(grid)
        return self.proj_drop(self.proj(linformer_attention_qkv(self.qkv(x), proj, self.num_heads, self.scale)))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        e, f = self.projections(grid)
        k = (k.transpose(-2, -1) @ e).transpose(-2, -1)  # Kᵀ E -> [B, h, k, d]: N·d·k per head
        v = (v.transpose(-2, -1) @ f).transpose(-2, -1)  # Vᵀ F -> [B, h, k, d]: N·d·k per head
        return sdpa(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)

    def attend_flops(self, grid: Grid) -> int:
        n, d = self.seq_len(grid), self.head_dim
        # E·K and F·V: N·k·d each per head
        project = 2 * self.num_heads * n * self.k * d
        # Q(EK)ᵀ: N·k·d, softmax·(FV): N·k·d, per head
        attend = sdpa_flops(1, self.num_heads, n, self.k, d)
        # interpolate at another grid: bilinear resampling of E/F, 4 per output entry (fvcore's rule)
        mats, heads = self.seq_proj.shape[:2]
        resample = 0 if tuple(grid) == self.grid else 4 * mats * heads * self.k * grid[0] * grid[1]
        return project + attend + resample

    def attend_memory(self, grid: Grid, batch: int, amp: Optional[torch.dtype]) -> list[Saved]:
        """What :class:`~vitzoo.ops.linformer.LinformerCore` keeps: the fused projection's output and, at a grid
        other than the construction grid, the resampled E/F (at the construction grid they are the parameter).
        Attention dropout in training takes the per-head SDPA form, which this formula does not cover (a one-line
        ConfigError). Args as :meth:`QKVAttention.attend_memory`."""
        check(self.attn_drop.p == 0, f"attention=linformer: memory() covers the fused core only, not the per-head "
                                     f"form that model.attn_drop_rate={self.attn_drop.p} takes")
        n = self.seq_len(grid)
        items = [Saved("q|k|v (projection output)", batch * n * 3 * self.dim, itemsize(amp))]  # [B, N, 3C]
        if tuple(grid) != self.grid:
            mats, heads = self.seq_proj.shape[:2]
            items.append(Saved("E/F resampled to the grid (fp32)", mats * heads * n * self.k, 4))  # [mats, heads, N, k]
        return items

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        e, f = self.projections(grid)
        e, f = e.expand(self.num_heads, -1, -1), f.expand(self.num_heads, -1, -1)  # [h, N, k]
        k = torch.einsum("hnj,bhnd->bhjd", e, k)  # k_j = Σ_n E_jn k_n  [B, h, k, d]
        v = torch.einsum("hnj,bhnd->bhjd", f, v)  # v_j = Σ_n F_jn v_n  [B, h, k, d]
        return dense_attention(q, k, v)

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        return {**super().symbols(grid), "k": self.k}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, k={self.k}, sharing={self.cfg.sharing}"
