"""Synthesizer: attention weights that are not made from query-key dot products.

Paper: Tay et al., "Synthesizer: Rethinking Self-Attention for Transformer Models", ICML 2021,
https://arxiv.org/abs/2005.00743.

``Y = softmax(B) G(X)`` per head, with ``G`` the value projection and the logits ``B [N, N]``:

* ``mode: dense``: each token predicts its own row of logits,
  ``B[i, :] = W₂ ReLU(W₁ xᵢ + b₁) + b₂`` (W₁: C -> C, split into h heads of d channels; each head
  has its own ``W₂ [N, d]`` and ``b₂ [N]``).
* ``mode: random``: ``B = R`` per head, a learned ``[N, N]`` matrix shared by all inputs; with
  ``rank: r`` factorised as ``R = R₁R₂ᵀ`` (``R₁, R₂ [N, r]``); with ``trainable: false`` R is a
  fixed random buffer drawn from a generator seeded by the layer index (std 1 so the fixed
  pattern is not near-uniform; the trainable one starts at std 0.02).

Fixed length: ``W₂, b₂`` (dense) and ``R`` / ``R₁, R₂`` (random) have a key axis (and, for random,
a query axis) of length ``N = P + H·W`` of the construction grid. Prefix tokens (ViT's class token)
are ordinary token positions: as a key the class token has its own logit column, as a query its
own row (random) or its own MLP output (dense). At another grid ``interpolate: true`` resamples
those token axes bilinearly (logits, so no area scaling: the softmax normalises); otherwise it is
a ConfigError.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, TokenMixer, check, check_positive
from vitzoo.attention.token_mixing.token_axis import TokenAxisMixin
from vitzoo.costs import Saved, casts_input, itemsize


@dataclass
class SynthesizerConfig:
    mode: str = "dense"  # "dense" (per-token MLP predicts N logits) or "random" (learned N×N logits)
    rank: Optional[int] = None  # random only: factorise R = R₁R₂ᵀ with rank r; null = full N×N
    trainable: bool = True  # random only: learn R; false = fixed random R seeded by the layer index
    interpolate: bool = False  # at another grid, resample the token axes instead of failing

    def __post_init__(self):
        check(self.mode in ("dense", "random"), f"attention.mode must be 'dense' or 'random' (got {self.mode!r})")
        if self.rank is not None:
            check_positive(self, "rank")
            check(self.mode == "random", f"attention.rank={self.rank} only applies to attention.mode=random")


@register_attention("synthesizer", SynthesizerConfig)
class SynthesizerAttention(TokenAxisMixin, TokenMixer):
    """Dense or random Synthesizer; its cost is :attr:`formula` (the instance's follows its mode).

    Args:
        cfg: :class:`SynthesizerConfig`.
        ctx: host dims; ``ctx.grid`` and ``ctx.num_prefix`` fix N.
    """

    formula = "3NC² + 2N²C"  # dense; the instance's formula follows its mode

    def __init__(self, cfg: SynthesizerConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        n, h, d = self.seq_len(), self.num_heads, self.head_dim
        self.mode, self.rank = cfg.mode, cfg.rank
        if cfg.mode == "random":
            self.formula = "2NC² + N²C" if cfg.rank is None else "2NC² + N²C + hN²r"
        if cfg.mode == "dense":
            self.dense1 = nn.Linear(ctx.dim, ctx.dim)  # W₁ (all heads): C -> h·d
            self.dense2_weight = nn.Parameter(trunc_normal_(torch.empty(h, n, d), std=0.02))  # W₂ per head
            self.dense2_bias = nn.Parameter(torch.zeros(h, n))  # b₂ per head
        else:
            shapes = [(h, n, n)] if cfg.rank is None else [(h, n, cfg.rank), (h, n, cfg.rank)]
            if cfg.trainable:
                self.random_logits = nn.ParameterList(
                    nn.Parameter(trunc_normal_(torch.empty(s), std=0.02)) for s in shapes)
            else:
                gen = torch.Generator().manual_seed(ctx.layer_index)
                for i, s in enumerate(shapes):  # kept in the state dict so a checkpoint reloads the pattern
                    self.register_buffer(f"random_logits_{i}", torch.randn(s, generator=gen))
        self.v = nn.Linear(ctx.dim, ctx.dim, bias=ctx.qkv_bias)  # G: value projection
        self.attn_drop = nn.Dropout(ctx.attn_drop)
        self.proj = nn.Linear(ctx.dim, ctx.dim)
        self.proj_drop = nn.Dropout(ctx.proj_drop)

    def random_factors(self) -> list[Tensor]:
        """``[R]`` or ``[R₁, R₂]``, trainable or fixed, at the construction grid."""
        if self.cfg.trainable:
            return list(self.random_logits)
        return [getattr(self, f"random_logits_{i}") for i in range(1 if self.rank is None else 2)]

    def logits(self, x: Tensor, grid: Grid) -> Tensor:
        """Synthesised logits ``B``: ``[B, h, N, N]`` (dense) or ``[h, N, N]`` (random, shared by the batch)."""
        if self.mode == "dense":
            w2 = self.token_param(self.dense2_weight, grid, dim=1)  # [h, N, d]
            b2 = self.token_param(self.dense2_bias, grid, dim=1)  # [h, N]
            (hid,) = self.to_heads(F.relu(self.dense1(x)))  # [B, h, N, d]
            return hid @ w2.transpose(-2, -1) + b2[:, None, :]  # [B, h, N, N]
        factors = self.random_factors()
        if self.rank is None:
            r = self.token_param(factors[0], grid, dim=1)  # query axis
            return self.token_param(r, grid, dim=2)  # key axis -> [h, N, N]
        r1, r2 = (self.token_param(f, grid, dim=1) for f in factors)  # [h, N, r] each
        return r1 @ r2.transpose(-2, -1)  # [h, N, N]

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        (v,) = self.to_heads(self.v(x))  # [B, h, N, d]
        attn = self.logits(x, grid).softmax(dim=-1)
        attn = self.attn_drop(attn.expand(x.shape[0], -1, -1, -1))  # [B, h, N, N]
        return self.merge_heads(attn @ v)

    def reference(self, x: Tensor, grid: Grid) -> Tensor:
        """Row by row: ``yᵢ = Σⱼ softmax(B[i, :])ⱼ vⱼ`` with B written out per token (dense) or per head (random)."""
        B, N, _ = x.shape
        h, d = self.num_heads, self.head_dim
        (v,) = self.to_heads(self.v(x))  # [B, h, N, d]
        if self.mode == "dense":
            w2 = self.token_param(self.dense2_weight, grid, dim=1)
            b2 = self.token_param(self.dense2_bias, grid, dim=1)
            hid = torch.relu(x @ self.dense1.weight.T + self.dense1.bias)  # [B, N, C]
            logits = torch.stack([
                torch.stack([hid[:, i, head * d:(head + 1) * d] @ w2[head].T + b2[head] for i in range(N)], dim=1)
                for head in range(h)], dim=1)  # [B, h, N, N]; row i from token i alone
        else:
            factors = self.random_factors()
            if self.rank is None:
                logits = self.token_param(self.token_param(factors[0], grid, dim=1), grid, dim=2)
            else:
                r1, r2 = (self.token_param(f, grid, dim=1) for f in factors)
                logits = torch.einsum("hir,hjr->hij", r1, r2)
            logits = logits.expand(B, h, N, N)
        weights = torch.exp(logits - logits.amax(-1, keepdim=True))
        weights = weights / weights.sum(-1, keepdim=True)
        return self.merge_heads(torch.einsum("bhij,bhjd->bhid", weights, v))

    def flops(self, grid: Optional[Grid] = None) -> int:
        grid = grid or self.grid
        n, c, h, d = self.seq_len(grid), self.dim, self.num_heads, self.head_dim
        total = n * c * c  # value projection G: N×C times C×C
        total += n * n * c  # softmax(B) · V: per head N×N times N×d
        total += n * c * c  # output projection: N×C times C×C
        n0 = self.seq_len()
        if self.mode == "dense":
            total += n * c * c  # W₁: N×C times C×C
            total += h * n * d * n  # per head hidden N×d times W₂ᵀ d×N
            total += self.token_param_flops(h * n0 * d, grid) + self.token_param_flops(h * n0, grid)  # resample W₂, b₂
        elif self.rank is None:
            # resample R along the query axis, then the key axis
            total += self.token_param_flops(h * n0 * n0, grid) + self.token_param_flops(h * n * n0, grid)
        else:
            total += h * n * self.rank * n  # R₁R₂ᵀ per head: N×r times r×N (once per batch)
            total += 2 * self.token_param_flops(h * n0 * self.rank, grid)  # resample R₁, R₂
        return total

    def memory(self, grid: Optional[Grid] = None, batch: int = 1, amp: Optional[torch.dtype] = None,
               input_dtype: Optional[torch.dtype] = None) -> list[Saved]:
        """What a training forward keeps: the projections' inputs and weight casts, the logits' inputs (dense: the
        ReLU output and both operands of the per-head product; random: the factors' casts or resampled copies),
        the softmax output where it needs a gradient and the operands of ``softmax(B)·V``.

        Dense mode projects the same input twice (``v`` and ``dense1``): under ``amp`` each makes its own cast
        of an fp32 input (autocast caches casts of leaf tensors only, and a block's input is none); an input in
        the autocast dtype is the one storage both keep.

        Args:
            grid: token grid (default: the construction grid); batch: images; amp: autocast dtype or ``None``;
            input_dtype: the input's dtype (``None``: fp32).
        """
        grid = grid or self.grid
        B, n, c, h, d, size = batch, self.seq_len(grid), self.dim, self.num_heads, self.head_dim, itemsize(amp)
        dense, learned = self.mode == "dense", self.mode == "dense" or self.cfg.trainable
        fold = B > 1 and h > 1  # a batched product copies an operand broadcast over images, or strided heads
        items = [Saved("v input", B * n * c, size), Saved("proj input", B * n * c, size)]  # [B, N, C] each
        if amp is not None:
            items += [Saved("v weight (autocast copy)", c * c, size), Saved("proj weight (autocast copy)", c * c, size)]
        if dense:
            items.append(Saved("ReLU output (dense1 output)", B * n * c, size))  # [B, N, C]
            if fold:  # else the heads are a view of the ReLU output, W₂ a view of itself
                items += [Saved("hidden heads (a copy)", B * h * n * d, size),  # [B·h, N, d]
                          Saved("W₂ᵀ broadcast over images (a copy)", B * h * d * n, size)]  # [B·h, d, N]
            else:
                items += self.token_param_memory("W₂", h * n * d, grid, amp)  # [h, N, d]
            if casts_input(amp, input_dtype):
                items.append(Saved("dense1 input (autocast copy)", B * n * c, size))  # [B, N, C]
            if amp is not None:
                items.append(Saved("dense1 weight (autocast copy)", c * c, size))  # [C, C]
        elif self.rank is not None and self.cfg.trainable:
            items += self.token_param_memory("R₁, R₂", 2 * h * n * self.rank, grid, amp)  # 2 x [h, N, r]
        # softmax(B): float32 logits (a parameter, or a product plus a float32 bias) stay float32 under amp;
        # R₁R₂ᵀ is an autocast product
        probs = (B if dense else 1) * h * n * n  # [B or 1, h, N, N]
        probs_size = size if self.mode == "random" and self.rank is not None else 4
        if learned:
            items.append(Saved("softmax output", probs, probs_size))
        if size != probs_size or (fold and not dense):  # softmax(B)·V reads a cast or broadcast copy
            items.append(Saved("probabilities broadcast over images (in the product's dtype)", B * h * n * n, size))
        elif not learned:  # the product keeps the softmax output itself
            items.append(Saved("softmax output", probs, probs_size))
        if learned:  # V's heads, kept for the probabilities' gradient (a copy, or a view of v's output)
            items.append(Saved("value heads", B * h * n * d, size))  # [B·h, N, d]
        return items

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        out = super().symbols(grid)
        return out if self.rank is None else {**out, "r": self.rank}
