"""MLP-Mixer token mixing: an MLP across tokens, shared across channels.

Paper: Tolstikhin et al., "MLP-Mixer: An all-MLP Architecture for Vision", NeurIPS 2021,
https://arxiv.org/abs/2105.01601.

``y = W₂ · GELU(W₁ · X + b₁) + b₂`` along the token axis, with ``W₁ [D, N]``, ``W₂ [N, D]`` and
``X [N, C]`` (the same MLP for every channel). No attention, no q/k/v.

Fixed length: the weights are built for ``N = P + H·W`` of the construction grid. Prefix tokens
(ViT's class token) are ordinary token positions: the class token has its own learned column in
``W₁`` and row in ``W₂``, so it is mixed into and out of the grid tokens like any other token.
At another grid ``interpolate: true`` resamples the token axis of ``W₁`` (scaled by the grid-area
ratio, see :meth:`TokenAxisMixin.token_param`), ``W₂`` and ``b₂`` bilinearly; otherwise it is a
ConfigError.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, TokenMixer, check_positive_number
from vitzoo.attention.token_mixing.token_axis import TokenAxisMixin, mix_tokens
from vitzoo.costs import Saved, itemsize


@dataclass
class MixerConfig:
    hidden_ratio: float = 2.0  # token-MLP hidden width D relative to N of the construction grid
    interpolate: bool = False  # at another grid, resample token-axis weights instead of failing

    def __post_init__(self):
        check_positive_number(self, "hidden_ratio")


@register_attention("mixer", MixerConfig)
class MLPMixerTokenMixing(TokenAxisMixin, TokenMixer):
    """Token-mixing MLP of MLP-Mixer; its cost is :attr:`formula` (plus resampling at another grid).

    Args:
        cfg: :class:`MixerConfig`.
        ctx: host dims; ``ctx.grid`` and ``ctx.num_prefix`` fix N.
    """

    formula = "2NDC"

    def __init__(self, cfg: MixerConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        n = self.seq_len()
        self.hidden = max(1, round(cfg.hidden_ratio * n))
        self.fc1 = nn.Linear(n, self.hidden)  # token axis N -> D
        self.fc2 = nn.Linear(self.hidden, n)  # D -> N
        self.proj_drop = nn.Dropout(ctx.proj_drop)

    def weights(self, grid: Grid) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``W₁ [D, N'], b₁ [D], W₂ [N', D], b₂ [N']`` at ``grid`` (resampled if it is not the construction grid)."""
        w1 = self.token_param(self.fc1.weight, grid, dim=1, mass=True)
        w2 = self.token_param(self.fc2.weight, grid, dim=0)
        b2 = self.token_param(self.fc2.bias, grid, dim=0)
        return w1, self.fc1.bias, w2, b2

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        w1, b1, w2, b2 = self.weights(grid)
        h = F.gelu(mix_tokens(x, w1, b1))  # [B, D, C]
        return self.proj_drop(mix_tokens(h, w2, b2))  # [B, N, C]

    def reference(self, x: Tensor, grid: Grid) -> Tensor:
        w1, b1, w2, b2 = self.weights(grid)
        h = F.gelu(torch.einsum("dn,bnc->bdc", w1, x) + b1[:, None])  # hidden token d = Σₙ W₁[d, n]·x[n]
        return torch.einsum("nd,bdc->bnc", w2, h) + b2[:, None]

    def flops(self, grid: Optional[Grid] = None) -> int:
        grid = grid or self.grid
        n, c, d = self.seq_len(grid), self.dim, self.hidden
        total = c * d * n  # W₁ · X: D×N times N×C
        total += c * n * d  # W₂ · H: N×D times D×C
        # resampling W₁, W₂ and b₂ when grid is not the construction grid
        total += self.token_param_flops(self.fc1.weight.numel(), grid)
        total += self.token_param_flops(self.fc2.weight.numel(), grid)
        total += self.token_param_flops(self.fc2.bias.numel(), grid)
        return total

    def memory(self, grid: Optional[Grid] = None, batch: int = 1, amp: Optional[torch.dtype] = None,
               input_dtype: Optional[torch.dtype] = None) -> list[Saved]:
        """What a training forward keeps: each token-axis linear's input (tokens along the last axis), the GELU's
        input and the token-axis weights where they are not the parameters themselves (autocast copies under
        ``amp``, resampled at another grid). Args as :meth:`TokenMixer.memory`."""
        grid = grid or self.grid
        n, c, d, size = self.seq_len(grid), self.dim, self.hidden, itemsize(amp)
        items = [
            Saved("fc1 input (tokens last, a copy)", batch * c * n, size),  # [B·C, N]
            Saved("GELU input (fc1 output)", batch * c * d, size),  # [B, C, D]
            Saved("fc2 input (GELU output)", batch * c * d, size),  # [B·C, D]
        ]
        items += self.token_param_memory("W₁", d * n, grid, amp)  # [D, N]
        return items + self.token_param_memory("W₂", n * d, grid, amp)  # [N, D]

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        return {**super().symbols(grid), "D": self.hidden}
