"""Hydra attention (``hydra``).

Paper: Bolya et al., "Hydra Attention: Efficient Attention with Many Heads", ECCV Workshops 2022,
https://arxiv.org/abs/2209.07484. As many heads as channels (``h = C``, d = 1) with the cosine-similarity
kernel: ``out = φ(Q) ⊙ Σ_n φ(k_n) ⊙ v_n`` with ``φ(x) = x / ‖x‖`` (each token's q and k L2-normalised
over its C channels). The model's ``num_heads`` is not used. A global mixer: prefix tokens are
ordinary tokens; no attention weights are formed, so ``attn_drop`` is not used.

FLOPs: the global feature ``Σ_n φ(k_n) ⊙ v_n`` is a contraction over N (N·C multiply-adds); the
final ``φ(q) ⊙ kv`` is an elementwise product (0, as every elementwise op in vitzoo's convention).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, TokenMixer
from vitzoo.costs import Saved, itemsize


@dataclass
class HydraConfig:
    """Hydra attention has no options (h = C heads and the cosine kernel are the method)."""


@register_attention("hydra", HydraConfig)
class HydraAttention(TokenMixer):
    """``φ(Q) ⊙ Σ_n φ(k_n) ⊙ v_n``, one head per channel; cost :attr:`formula`.

    Args:
        cfg: HydraConfig.
        ctx: dims, grid and prefix tokens from the host block.
    """

    sequence_capable = True  # the output depends on the tokens as a sequence only
    formula = "4NC² + NC"
    linear_cost = True

    def __init__(self, cfg: HydraConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        self.qkv = nn.Linear(ctx.dim, 3 * ctx.dim, bias=ctx.qkv_bias)
        self.proj = nn.Linear(ctx.dim, ctx.dim)
        self.proj_drop = nn.Dropout(ctx.proj_drop)

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x [B, N, C]
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        kv = torch.einsum("bnc,bnc->bc", k, v)  # [B, C]: N·C
        return self.proj_drop(self.proj(q * kv[:, None]))  # [B, N, C]

    def reference(self, x: Tensor, grid: Grid) -> Tensor:
        """Loop over the N tokens: ``out_i = Σ_j (q_i/‖q_i‖) ⊙ (k_j/‖k_j‖) ⊙ v_j`` (cosine kernel per channel)."""
        w, b = self.qkv.weight, self.qkv.bias
        qkv = x @ w.T + (0 if b is None else b)
        C = self.dim
        q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
        q = q / q.square().sum(-1, keepdim=True).sqrt()
        k = k / k.square().sum(-1, keepdim=True).sqrt()
        acc = torch.zeros_like(q[:, 0])
        for j in range(x.shape[1]):
            acc = acc + k[:, j] * v[:, j]
        return self.proj_drop(self.proj(q * acc[:, None]))

    def flops(self, grid=None) -> int:
        n, c = self.seq_len(grid), self.dim
        # qkv 3NC², Σ_n k⊙v N·C, proj NC²
        return 4 * n * c * c + n * c

    def memory(self, grid: Optional[Grid] = None, batch: int = 1, amp: Optional[torch.dtype] = None,
               input_dtype: Optional[torch.dtype] = None) -> list[Saved]:
        n, C, size = self.seq_len(grid), self.dim, itemsize(amp)
        tokens = batch * n * C  # one [B, N, C] tensor
        items = [Saved("qkv input", tokens, size), Saved("proj input q̂ ⊙ kv", tokens, size)]
        if amp is not None:
            items += [Saved("qkv weight (autocast copy)", 3 * C * C, size),
                      Saved("proj weight (autocast copy)", C * C, size)]
        # F.normalize reads q and k (views of q|k|v) and keeps each token's norm and clamped norm [B, N, 1]
        items += [Saved("q|k|v (projection output)", 3 * tokens, size),  # [B, N, 3C]
                  *(Saved(f"{t} token norms{c}", batch * n, size) for t in "qk" for c in ("", " (clamped)"))]
        # the einsum's batched product takes k̂ and v as [B·C, N, 1] copies; q̂ ⊙ kv keeps both factors
        return items + [Saved("k̂ (einsum copy)", tokens, size), Saved("v (einsum copy)", tokens, size),
                        Saved("kv = Σ_n k̂ ⊙ v", batch * C, size), Saved("q̂", tokens, size)]
