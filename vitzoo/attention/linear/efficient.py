"""Efficient Attention (``efficient``).

Paper: Shen et al., "Efficient Attention: Attention with Linear Complexities", WACV 2021,
https://arxiv.org/abs/1812.01243. ``out = ρq(Q)(ρk(K)ᵀV)`` with ``ρq`` a softmax of each query
over its d features and ``ρk`` a softmax of each key feature over the N positions. A global mixer:
prefix tokens are ordinary tokens; no attention weights are formed, so ``attn_drop`` is not used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, QKVAttention
from vitzoo.costs import Saved, itemsize
from vitzoo.ops.efficient import efficient_attention_qkv


@dataclass
class EfficientConfig:
    """Efficient Attention has no options (softmax normalisers ρq, ρk, no scaling, as in the paper)."""


@register_attention("efficient", EfficientConfig)
class EfficientAttention(QKVAttention):
    """``ρq(Q)(ρk(K)ᵀV)``: d global context vectors mixed per query; cost :attr:`formula` (d = C/h).

    Args:
        cfg: EfficientConfig (validated options, see ``configs/attention/efficient.yaml``).
        ctx: dims, heads, grid, prefix tokens and layer index from the host block.
    """

    sequence_capable = True  # the output depends on the tokens as a sequence only
    formula = "4NC² + 2NdC"
    linear_cost = True

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        # fused: qkv [B, N, 3C] -> heads merged [B, N, C]; the softmaxes recomputed in backward
        return self.proj_drop(self.proj(efficient_attention_qkv(self.qkv(x), self.num_heads)))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        # the per-head form (forward fuses it with the head split and merge): same values
        context = k.softmax(dim=-2).transpose(-2, -1) @ v  # ρk(K)ᵀV [B, h, d, d]: N·d·d per head
        return q.softmax(dim=-1) @ context  # ρq(Q)·context [B, h, N, d]: N·d·d per head

    def attend_flops(self, grid: Grid) -> int:
        n, d = self.seq_len(grid), self.head_dim
        # ρk(K)ᵀV: N·d·d per head, ρq(Q)(ρk(K)ᵀV): N·d·d per head
        return self.num_heads * 2 * n * d * d

    def attend_memory(self, grid: Grid, batch: int, amp: Optional[torch.dtype]) -> list[Saved]:
        n, h, d, size = self.seq_len(grid), self.num_heads, self.head_dim, itemsize(amp)
        # the fused core keeps q|k|v and the context in q|k|v's dtype; the softmaxes are recomputed in backward
        return [Saved("q|k|v (projection output)", batch * n * 3 * self.dim, size),  # [B, N, 3C]
                Saved("context ρk(K)ᵀV", batch * h * d * d, size)]  # [B, h, d, d]

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        """The definition written out as one triple sum, with explicit exp-normalisations.

        ``ρq(q_i)_c = exp(q_ic) / Σ_c' exp(q_ic')`` (over features), ``ρk(k_j)_c = exp(k_jc) / Σ_j' exp(k_j'c)``
        (over positions), ``out_ie = Σ_c Σ_j ρq(q_i)_c ρk(k_j)_c v_je``.
        """
        eq = (q - q.amax(dim=-1, keepdim=True)).exp()
        rho_q = eq / eq.sum(dim=-1, keepdim=True)  # [B, h, N, d], each query sums to 1 over features
        ek = (k - k.amax(dim=-2, keepdim=True)).exp()
        rho_k = ek / ek.sum(dim=-2, keepdim=True)  # [B, h, N, d], each feature sums to 1 over positions
        return torch.einsum("bhic,bhjc,bhje->bhie", rho_q, rho_k, v)

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        return {**super().symbols(grid), "d": self.head_dim}
