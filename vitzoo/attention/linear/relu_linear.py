"""EfficientViT's ReLU linear attention (``relu_linear``).

Paper: Cai et al., "EfficientViT: Multi-Scale Linear Attention for High-Resolution Dense Prediction",
ICCV 2023, https://arxiv.org/abs/2205.14756. ``out_i = Σ_j (ReLU(q_i)·ReLU(k_j)) v_j / Σ_j ReLU(q_i)·ReLU(k_j)``,
computed as ``ReLU(Q)(ReLU(K)ᵀV)`` over ``ReLU(Q)(Σ_j ReLU(k_j))``: cost linear in N.

The paper's LiteMLA block, as in its released code:

* heads of ``attention.head_dim`` channels (8, EfficientViT's width): h = C / 8 heads, whatever
  ``model.num_heads`` says (``head_dim: null`` takes the model's C/h instead);
* multi-scale aggregation (``attention.scales``, default ``[5]``): for each kernel side s the q/k/v maps of
  the grid tokens go through a depthwise s×s convolution and a 1×1 convolution grouped per head, giving
  h more heads of q/k/v; all ``(1 + S)h`` heads attend, and the output projection maps the ``(1 + S)·C``
  channels back to C;
* BatchNorm after the output projection (``attention.proj_norm: batch``; the projection then has no bias,
  as the paper's 1×1 convolution). Tokens are the batch of the norm: its statistics run over images and
  tokens, the class token included.

Prefix tokens are ordinary tokens of the attention; in the aggregated heads they keep their own q/k/v (a
convolution needs grid neighbours). No attention weights are formed, so ``attn_drop`` is not used. The
attention core runs in float32 under autocast (as the paper's code), so the normaliser of a query with
ReLU(q)·Σ ReLU(k) = 0 stays exact; so do the q/k/v projection and the aggregation (the paper's code runs them
in half precision: in bf16 their rounding, through the normalisers of 8-channel heads, moves outputs by several
per cent). Under autocast only the output projection runs in half precision.

Where vitzoo departs from the paper's block: the q/k/v projection is a token-wise linear layer with the model's
``qkv_bias`` (the paper's 1×1 convolution has no bias), and the block sits in a pre-norm transformer block
(LayerNorm before it, a residual around it), where EfficientViT pairs it with an MBConv.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, TokenMixer, check, check_positive
from vitzoo.costs import Saved, itemsize

EPS = 1e-15  # added to the normaliser (the paper's code), exact in float32
PROJ_NORMS = ("batch", "none")  # values of attention.proj_norm


@dataclass
class ReLULinearConfig:
    scales: list[int] = field(default_factory=lambda: [5])  # kernel sides of the multi-scale aggregation ([] = none)
    head_dim: Optional[int] = 8  # channels per head (EfficientViT: 8); None: C / model.num_heads
    proj_norm: str = "batch"  # after the output projection: batch (BatchNorm, the paper) or none

    def __post_init__(self):
        self.scales = list(self.scales)
        check(all(isinstance(s, int) and not isinstance(s, bool) and s > 0 and s % 2 == 1 for s in self.scales),
              f"attention.scales must be a list of odd positive integers (got {self.scales!r})")
        if self.head_dim is not None:
            check_positive(self, "head_dim")
        check(self.proj_norm in PROJ_NORMS,
              f"attention.proj_norm must be one of {', '.join(PROJ_NORMS)} (got {self.proj_norm!r})")


@register_attention("relu_linear", ReLULinearConfig)
class ReLULinearAttention(TokenMixer):
    """``ReLU(Q)(ReLU(K)ᵀV) / ReLU(Q)ΣReLU(K)`` with multi-scale heads and a BatchNorm; cost :attr:`formula`
    (β = 2: fvcore's count per element of an eval-mode BatchNorm, its scale and shift, as FLOPs are measured in
    eval; fvcore counts a training-mode one as 5 per element; β = 0 with ``proj_norm: none``).

    Args:
        cfg: ReLULinearConfig.
        ctx: dims, heads, grid and prefix tokens from the host block.
    """

    sequence_capable = True  # single-scale: the output depends on the tokens as a sequence only
    formula = "3NC² + 3MC(K + Sd) + (1 + S)(NC² + 2NdC + NC) + βNC"
    linear_cost = True

    @classmethod
    def takes_sequence(cls, cfg: Any) -> bool:
        """Single-scale heads only (attention.scales=[]): the multi-scale aggregation convolves over the token grid."""
        return not cfg.scales

    def __init__(self, cfg: ReLULinearConfig, ctx: MixerContext):
        if cfg.head_dim is not None:
            check(ctx.dim % cfg.head_dim == 0,
                  f"attention.head_dim={cfg.head_dim} must divide model.embed_dim ({ctx.dim}); pick a divisor or null "
                  f"(C / model.num_heads)")
        super().__init__(cfg, ctx)
        if cfg.head_dim is not None:  # the paper's narrow heads: h = C / head_dim
            self.head_dim, self.num_heads = cfg.head_dim, ctx.dim // cfg.head_dim
        C3 = 3 * ctx.dim
        self.qkv = nn.Linear(ctx.dim, C3, bias=ctx.qkv_bias)
        self.aggreg = nn.ModuleList(
            nn.Sequential(nn.Conv2d(C3, C3, s, padding=s // 2, groups=C3, bias=False),
                          nn.Conv2d(C3, C3, 1, groups=3 * self.num_heads, bias=False))
            for s in cfg.scales
        )
        batch = cfg.proj_norm == "batch"
        self.proj = nn.Linear((1 + len(cfg.scales)) * ctx.dim, ctx.dim, bias=not batch)
        self.norm = nn.BatchNorm1d(ctx.dim) if batch else None
        self.proj_drop = nn.Dropout(ctx.proj_drop)

    def project(self, o: Tensor) -> Tensor:
        """``o[B, N, (1 + S)C] -> [B, N, C]``: the output projection, its BatchNorm over images and tokens, dropout."""
        o = self.proj(o)
        if self.norm is not None:
            B, N, C = o.shape
            o = self.norm(o.reshape(B * N, C)).reshape(B, N, C)  # tokens as the norm's batch [B·N, C]
        return self.proj_drop(o)

    def branches(self, qkv: Tensor, grid: Grid) -> list[Tensor]:
        """``qkv[B, N, 3C]`` and its aggregated copies (prefix tokens unchanged), each ``[B, N, 3C]``."""
        P, (H, W) = self.num_prefix, grid
        B, N, C3 = qkv.shape
        maps = qkv[:, P:].transpose(1, 2).reshape(B, C3, H, W)  # [B, 3C, H, W]
        out = [qkv]
        for agg in self.aggreg:
            grid_part = agg(maps).reshape(B, C3, H * W).transpose(1, 2)  # [B, HW, 3C]
            out.append(torch.cat([qkv[:, :P], grid_part], dim=1))  # [B, N, 3C]
        return out

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)  # half precision: q/k/v, aggregation, core in float32
        with torch.autocast(x.device.type, enabled=False):
            heads = [self.to_heads(t, 3) for t in self.branches(self.qkv(x.to(dtype)), grid)]
            q, k, v = (torch.cat([h[i] for h in heads], dim=1) for i in range(3))  # [B, (1+S)h, N, d]
            q, k = F.relu(q), F.relu(k)
            kv = k.transpose(-2, -1) @ v  # [B, h', d, d]: N·d·d per head
            num = q @ kv  # [B, h', N, d]: N·d·d per head
            den = torch.einsum("bhnd,bhd->bhn", q, k.sum(dim=2))  # [B, h', N]: N·d per head
            o = (num / (den[..., None] + EPS)).to(x.dtype)
        B, _, N, _ = o.shape
        o = o.transpose(1, 2).reshape(B, N, -1)  # [B, N, (1+S)C]
        return self.project(o)

    def memory(self, grid: Optional[Grid] = None, batch: int = 1, amp: Optional[torch.dtype] = None,
               input_dtype: Optional[torch.dtype] = None) -> list[Saved]:
        (H, W), n, C, d = grid or self.grid, self.seq_len(grid), self.dim, self.head_dim
        S, size = len(self.cfg.scales), itemsize(amp)
        heads = batch * (1 + S) * self.num_heads  # B·(1 + S)h (image, head) pairs
        wide = batch * n * (1 + S) * C  # one [B, (1 + S)h, N, d] tensor
        # autocast is off up to the output projection: q/k/v, the aggregation and the core keep float32
        items = [Saved("qkv input", batch * n * C, 4)]
        if S:  # the depthwise convolutions read the grid maps as views of q|k|v [B, N, 3C]
            depthwise = max(blocked_weight_grad(batch, 3 * C, 1, 1, s) for s in self.cfg.scales)
            items.append(Saved("q|k|v (projection output)", batch * n * 3 * C, 4, workspace=depthwise))
        pointwise = blocked_weight_grad(batch, 3 * self.num_heads, d, d, 1)  # 3h groups of d channels
        items += [Saved(f"depthwise {s}×{s} output", batch * 3 * C * H * W, 4, workspace=pointwise)
                  for s in self.cfg.scales]
        items += [Saved("ReLU(Q)", wide, 4), Saved("ReLU(K)", wide, 4), Saved("V (heads concatenated)", wide, 4),
                  Saved("ReLU(K)ᵀV", heads * d * d, 4),  # [B, h', d, d]
                  Saved("Σ_n ReLU(k_n)", heads * d, 4),  # [B, h', d]
                  Saved("numerator ReLU(Q)(ReLU(K)ᵀV)", wide, 4),
                  Saved("normaliser + EPS", heads * n, 4),  # [B, h', N, 1]
                  Saved("proj input", wide, size)]  # [B, N, (1 + S)C]
        if amp is not None:
            items.append(Saved("proj weight (autocast copy)", (1 + S) * C * C, size))
        if self.norm is not None:  # BatchNorm keeps its input [B·N, C] and the batch mean and inverse std [C] in fp32
            items += [Saved("BatchNorm input", batch * n * C, size), Saved("BatchNorm mean", C, 4),
                      Saved("BatchNorm inverse std", C, 4)]
        return items

    def reference(self, x: Tensor, grid: Grid) -> Tensor:
        """Explicit kernel sums over an N×N matrix of ``ReLU(q_i)·ReLU(k_j)``; the aggregation as shifted sums."""
        qkv = x @ self.qkv.weight.T + (0 if self.qkv.bias is None else self.qkv.bias)
        outs = [_relu_attention(qkv, self.num_heads)]
        for agg in self.aggreg:
            outs.append(_relu_attention(self._aggregate(qkv, agg, grid), self.num_heads))
        o = torch.cat(outs, dim=-1)  # [B, N, (1+S)C]
        return self.project(o)

    def _aggregate(self, qkv: Tensor, agg: nn.Sequential, grid: Grid) -> Tensor:
        """Depthwise s×s as a sum of zero-padded shifts, then the grouped 1×1 as an einsum per group."""
        P, (H, W) = self.num_prefix, grid
        dw, pw = agg[0].weight[:, 0], agg[1].weight[:, :, 0, 0]  # [3C, s, s], [3C, d]
        s, B, C3 = dw.shape[-1], qkv.shape[0], qkv.shape[-1]
        r = s // 2
        g = F.pad(qkv[:, P:].reshape(B, H, W, C3), (0, 0, r, r, r, r))  # [B, H+2r, W+2r, 3C]
        acc = sum(g[:, i:i + H, j:j + W] * dw[:, i, j] for i in range(s) for j in range(s))
        groups = acc.reshape(B, H * W, 3 * self.num_heads, self.head_dim)  # [B, HW, 3h, d]
        mixed = torch.einsum("bngi,goi->bngo", groups, pw.reshape(3 * self.num_heads, self.head_dim, -1))
        return torch.cat([qkv[:, :P], mixed.reshape(B, H * W, C3)], dim=1)

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        h, w = grid or self.grid
        return {**super().symbols(grid), "h": self.num_heads, "M": h * w, "K": sum(s * s for s in self.cfg.scales),
                "S": len(self.cfg.scales), "d": self.head_dim, "β": self.norm_cost()}

    def norm_cost(self) -> int:
        """fvcore's count per element of the BatchNorm in eval mode (scale and shift: 2); 0 without it."""
        return 0 if self.norm is None else 2

    def flops(self, grid: Optional[Grid] = None) -> int:
        n, c, d = self.seq_len(grid), self.dim, self.head_dim
        h, w = grid or self.grid
        S, K = len(self.cfg.scales), sum(s * s for s in self.cfg.scales)
        total = 3 * n * c * c  # qkv projection
        total += 3 * h * w * c * (K + S * d)  # depthwise s×s (3C·s² per token) + grouped 1×1 (3C·d per token)
        # per head: ReLU(K)ᵀV N·d², ReLU(Q)·kv N·d², normaliser N·d; proj (1+S)C -> C
        total += (1 + S) * (n * c * c + 2 * n * d * c + n * c)
        return total + self.norm_cost() * n * c  # BatchNorm after the projection


def blocked_weight_grad(batch: int, groups: int, in_per_group: int, out_per_group: int, side: int) -> int:
    """Bytes of the weight gradient oneDNN makes in the backward of a grouped ``side × side`` convolution on CPU
    whose input is channels-last (the aggregation's grid maps, views of q|k|v ``[B, N, 3C]``): each group's
    out × in block padded to 16 × 16 (its ``aBCde16c16b`` format), float32, reordered to the weight's layout
    after. A depthwise convolution of 3C channels holds 256× its weight: 19.7 MB at 3C = 768 and a 5×5 kernel.
    At batch 1 oneDNN runs the convolution in the plain layout, with no padded copy: 0.

    Args:
        batch: images per step; groups: the convolution's groups; in_per_group, out_per_group: channels per
            group; side: kernel side.
    """
    if batch == 1:
        return 0

    def padded(channels: int) -> int:
        return -(-channels // 16) * 16

    return groups * padded(out_per_group) * padded(in_per_group) * side * side * 4


def _relu_attention(qkv: Tensor, heads: int) -> Tensor:
    """``[B, N, 3C] -> [B, N, C]``: per head ``Σ_j w_ij v_j / Σ_j w_ij`` with ``w_ij = ReLU(q_i)·ReLU(k_j)``."""
    B, N, C3 = qkv.shape
    t = qkv.reshape(B, N, 3, heads, C3 // (3 * heads)).permute(2, 0, 3, 1, 4)  # [3, B, h, N, d]
    q, k, v = t[0].clamp(min=0), t[1].clamp(min=0), t[2]
    w = torch.einsum("bhid,bhjd->bhij", q, k)  # [B, h, N, N]
    o = torch.einsum("bhij,bhjd->bhid", w, v) / (w.sum(-1, keepdim=True) + EPS)
    return o.transpose(1, 2).reshape(B, N, -1)
