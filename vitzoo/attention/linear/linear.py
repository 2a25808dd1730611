"""Linear attention (``linear``); Efficient Attention (``efficient``) is registered in ``efficient.py``.

Papers:
- ``linear``: Katharopoulos et al., "Transformers are RNNs: Fast Autoregressive Transformers with
  Linear Attention", ICML 2020, https://arxiv.org/abs/2006.16236. Feature map ``φ(x) = elu(x) + 1``,
  ``out = φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1)`` (non-causal form).
- ``efficient``: Shen et al., "Efficient Attention: Attention with Linear Complexities", WACV 2021,
  https://arxiv.org/abs/1812.01243. ``out = ρq(Q)(ρk(K)ᵀV)`` with ``ρq`` a softmax of each query
  over its d features and ``ρk`` a softmax of each key feature over the N positions.

Both are global mixers: prefix tokens (the class token) are ordinary tokens, as queries and as
keys/values. Neither forms attention weights in its fast path, so ``attn_drop`` is not used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, QKVAttention
from vitzoo.attention.linear.feature_map import (
    feature_core_memory,
    feature_map_attention,
    feature_map_attention_flops,
    feature_map_attention_quadratic,
)
from vitzoo.costs import Saved, itemsize
from vitzoo.ops.feature import feature_attention_qkv


def elu_features(x: Tensor) -> Tensor:
    """Katharopoulos et al.'s positive feature map ``elu(x) + 1`` (elementwise, m = d)."""
    return F.elu(x) + 1


@dataclass
class LinearConfig:
    """Linear attention has no options: the feature map elu(x)+1 has as many features as the head dim."""


@register_attention("linear", LinearConfig)
class LinearAttention(QKVAttention):
    """Kernel attention with ``φ = elu + 1``; its cost is :attr:`formula` (d = C/h).

    Args:
        cfg: LinearConfig (validated options, see ``configs/attention/linear.yaml``).
        ctx: dims, heads, grid, prefix tokens and layer index from the host block.
    """

    sequence_capable = True  # the output depends on the tokens as a sequence only
    formula = "4NC² + 2NdC + 2NC"
    linear_cost = True

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        # fused: qkv [B, N, 3C] -> heads merged [B, N, C]; φ recomputed in backward, not stored
        return self.proj_drop(self.proj(feature_attention_qkv("elu", self.qkv(x), self.num_heads)))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        # the per-head form (forward fuses it with the head split and merge): same values
        return feature_map_attention(elu_features(q), elu_features(k), v)

    def attend_flops(self, grid: Grid) -> int:
        # φ(K)ᵀ[V | 1]: N·d·(d+1), φ(Q)·[φ(K)ᵀV | φ(K)ᵀ1]: N·d·(d+1) per head -> 2NdC + 2NC
        return feature_map_attention_flops(self.num_heads, self.seq_len(grid), self.head_dim, self.head_dim)

    def attend_memory(self, grid: Grid, batch: int, amp: Optional[torch.dtype]) -> list[Saved]:
        # the fused core keeps q|k|v, φ(K)ᵀ[V | 1] and the normalisers; elu features: m = d, no stabilisers
        d = self.head_dim
        return feature_core_memory(batch, self.seq_len(grid), self.num_heads, d, d, itemsize(amp), shifts=False)

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        # (φ(Q)φ(K)ᵀ)V / (φ(Q)φ(K)ᵀ1), the N×N kernel matrix written out
        return feature_map_attention_quadratic(elu_features(q), elu_features(k), v)

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        return {**super().symbols(grid), "d": self.head_dim}


