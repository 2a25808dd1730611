"""Global multi-head self-attention (MSA).

Paper: Vaswani et al., "Attention Is All You Need", NeurIPS 2017, https://arxiv.org/abs/1706.03762;
as used in ViT (Dosovitskiy et al., https://arxiv.org/abs/2010.11929).

Every token, prefix tokens included, attends to every token. Runs through
``torch.nn.functional.scaled_dot_product_attention`` (flash / memory-efficient kernels).
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, QKVAttention
from vitzoo.attention.functional import dense_attention, sdpa, sdpa_flops


@dataclass
class GlobalConfig:
    """Global MSA has no options beyond the host's dims and heads."""


@register_attention("global", GlobalConfig)
class GlobalAttention(QKVAttention):
    """Multi-head self-attention over all N = P + H·W tokens; its cost is :attr:`formula`."""

    sequence_capable = True  # the output depends on the tokens as a sequence only
    formula = "4NC² + 2N²C"

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        return sdpa(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)

    def attend_flops(self, grid: Grid) -> int:
        n = self.seq_len(grid)
        # QKᵀ: N·N·d per head, AV: N·N·d per head -> 2N²C over h heads
        return sdpa_flops(1, self.num_heads, n, n, self.head_dim)

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        return dense_attention(q, k, v)
