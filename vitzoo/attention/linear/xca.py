"""Cross-covariance attention (``xca``).

Paper: El-Nouby et al., "XCiT: Cross-Covariance Image Transformers", NeurIPS 2021,
https://arxiv.org/abs/2106.09681. Attention runs over channels instead of tokens: per head the
``d×d`` matrix ``softmax(τ · K̂ᵀQ̂)`` (rows and columns of ``Q̂``, ``K̂`` L2-normalised over the N tokens,
``τ`` a learned temperature per head) mixes the d channels of V at every token. Cost linear in N.
A global mixer: prefix tokens are ordinary tokens (they enter the N-long sums like any other).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, QKVAttention
from vitzoo.costs import Saved, itemsize


@dataclass
class XCAConfig:
    """XCA has no options (learned temperature initialised to 1, as in the paper's code)."""


@register_attention("xca", XCAConfig)
class CrossCovarianceAttention(QKVAttention):
    """``V · softmax(τ K̂ᵀQ̂)ᵀ`` per head over the d channels; cost :attr:`formula` (d = C/h).

    Args:
        cfg: XCAConfig.
        ctx: dims, heads, grid and prefix tokens from the host block.
    """

    sequence_capable = True  # the output depends on the tokens as a sequence only
    formula = "4NC² + 2NdC"
    linear_cost = True

    def __init__(self, cfg: XCAConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        self.temperature = nn.Parameter(torch.ones(ctx.num_heads, 1, 1))  # τ per head [h, 1, 1]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        q = F.normalize(q, dim=-2)  # [B, h, N, d], each channel unit-norm over the tokens
        k = F.normalize(k, dim=-2)
        attn = (q.transpose(-2, -1) @ k) * self.temperature  # [B, h, d, d]: N·d·d per head
        attn = self.attn_drop(attn.softmax(dim=-1))
        return v @ attn.transpose(-2, -1)  # [B, h, N, d]: N·d·d per head

    def attend_flops(self, grid: Grid) -> int:
        n, d = self.seq_len(grid), self.head_dim
        # Q̂ᵀK̂: N·d·d per head; V·Aᵀ: N·d·d per head
        return self.num_heads * 2 * n * d * d

    def attend_memory(self, grid: Grid, batch: int, amp: Optional[torch.dtype]) -> list[Saved]:
        n, h, d, C, size = self.seq_len(grid), self.num_heads, self.head_dim, self.dim, itemsize(amp)
        weights = batch * h * d * d  # one [B, h, d, d] matrix
        # F.normalize over the tokens reads q and k (views of q|k|v) and keeps each one's norm and clamped norm
        items = [Saved("q|k|v (projection output)", batch * n * 3 * C, size),  # [B, N, 3C]
                 *(Saved(f"{t} column norms{c}", batch * C, size) for t in "qk" for c in ("", " (clamped)")),
                 Saved("q̂", batch * n * C, size), Saved("k̂", batch * n * C, size),  # [B, h, N, d] each
                 Saved("scores Q̂ᵀK̂ (τ's gradient)", weights, size),
                 Saved("softmax weights", weights, itemsize(amp, cast=False))]  # autocast keeps softmax in fp32
        if self.attn_drop.p > 0:  # CPU's dropout multiplies by a scaled mask in the weights' dtype (fp32)
            items.append(Saved("dropout mask", weights, 4))
            if amp is None:  # V·Aᵀ reads the dropped weights (under autocast: their cast below)
                items.append(Saved("dropped weights", weights, 4))
        if amp is not None:
            items.append(Saved("weights (autocast copy)", weights, size))
        return items + [Saved("v (heads layout copy)", batch * n * C, size)]  # [B·h, N, d]

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        """Explicit sums: ``A_ce = τ Σ_n q_nc k_ne / (‖q_·c‖ ‖k_·e‖)``, ``out_nc = Σ_e softmax_e(A)_ce v_ne``."""
        qn = q / q.square().sum(dim=2, keepdim=True).sqrt()
        kn = k / k.square().sum(dim=2, keepdim=True).sqrt()
        scores = torch.einsum("bhnc,bhne->bhce", qn, kn) * self.temperature
        e = (scores - scores.amax(dim=-1, keepdim=True)).exp()
        weights = e / e.sum(dim=-1, keepdim=True)  # [B, h, d (out channel c), d (in channel e)]
        return torch.einsum("bhce,bhne->bhnc", weights, v)

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        return {**super().symbols(grid), "d": self.head_dim}
