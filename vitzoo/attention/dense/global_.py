"""Global multi-head self-attention (MSA).

Paper: Vaswani et al., "Attention Is All You Need", NeurIPS 2017, https://arxiv.org/abs/1706.03762;
as used in ViT (Dosovitskiy et al., https://arxiv.org/abs/2010.11929).

Every token, prefix tokens included, attends to every token. Runs through
``torch.nn.functional.scaled_dot_product_attention`` (flash / memory-efficient kernels).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, QKVAttention
from vitzoo.attention.functional import dense_attention, sdpa, sdpa_flops
from vitzoo.costs import Saved, itemsize
from vitzoo.ops.sdpa import fp32_backward_workspace


@dataclass
class GlobalConfig:
    """Global MSA has no options beyond the host's dims and heads."""


@register_attention("global", GlobalConfig)
class GlobalAttention(QKVAttention):
    """Multi-head self-attention over all N = P + H·W tokens; its cost is :attr:`formula`."""

    sequence_capable = True  # the output depends on the tokens as a sequence only
    exposes_attention = True  # forward_with_keys: token reducers read its keys and weight its scores
    formula = "4NC² + 2N²C"

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid, key_bias: Optional[Tensor] = None) -> Tensor:
        return sdpa(q, k, v, attn_mask=key_bias, dropout_p=self.attn_drop.p if self.training else 0.0)

    def forward_with_keys(self, x: Tensor, grid: Grid,
                          key_bias: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self.split_heads(x)
        bias = None if key_bias is None else key_bias.to(q.dtype)  # the scores' dtype (bf16 under autocast)
        return self.merge_heads(self.attend(q, k, v, grid, bias)), q, k

    def attend_flops(self, grid: Grid) -> int:
        n = self.seq_len(grid)
        # QKᵀ: N·N·d per head, AV: N·N·d per head -> 2N²C over h heads
        return sdpa_flops(1, self.num_heads, n, n, self.head_dim)

    def attend_memory(self, grid: Grid, batch: int, amp: Optional[torch.dtype]) -> list[Saved]:
        n, h, C, size = self.seq_len(grid), self.num_heads, self.dim, itemsize(amp)
        # CPU's fused kernel keeps q, k, v (views of the projection's output), its output and the row log-sum-exp;
        # on short sequences under amp its backward works on fp32 copies (the workspace)
        workspace = fp32_backward_workspace(batch * h, n, n, C // h, amp=amp)
        return [Saved("q|k|v (projection output)", batch * n * 3 * C, size, workspace=workspace),
                Saved("attention output", batch * n * C, size), Saved("row log-sum-exp", batch * h * n, 4)]

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        return dense_attention(q, k, v)
