"""gMLP spatial gating unit (SGU) as a token mixer.

Paper: Liu et al., "Pay Attention to MLPs", NeurIPS 2021, https://arxiv.org/abs/2105.08050.

``Z = GELU(X U)`` split into halves ``Z₁, Z₂`` (D channels each); ``s(Z) = Z₁ ⊙ (W · LN(Z₂) + b)``
with a learned token-to-token matrix ``W [N, N]`` and bias ``b [N]``; output ``s(Z) V``. As in the
paper ``W`` starts near zero and ``b`` at one, so the unit starts close to a channel MLP. In vitzoo
the unit replaces attention inside the pre-norm block (the block's MLP follows), so the default
width is ``D = C`` rather than the paper's 3C–6C.

Fixed length: ``W`` and ``b`` are built for ``N = P + H·W`` of the construction grid. Prefix tokens
(ViT's class token) are ordinary token positions of ``W`` (own row and column). At another grid
``interpolate: true`` resamples both axes of ``W`` (the input axis scaled by the grid-area ratio)
and ``b`` bilinearly; otherwise it is a ConfigError.
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
class GMLPConfig:
    ffn_ratio: float = 1.0  # width D of each gated half relative to C (input projection C -> 2D)
    init_eps: float = 1e-3  # W starts uniform in ±init_eps/N (b starts at 1), as in the paper
    interpolate: bool = False  # at another grid, resample W and b instead of failing

    def __post_init__(self):
        check_positive_number(self, "ffn_ratio", "init_eps")


@register_attention("gmlp", GMLPConfig)
class SpatialGatingUnit(TokenAxisMixin, TokenMixer):
    """gMLP's spatial gating unit with its channel projections; its cost is :attr:`formula`.

    Args:
        cfg: :class:`GMLPConfig`.
        ctx: host dims; ``ctx.grid`` and ``ctx.num_prefix`` fix N.
    """

    formula = "3NDC + N²D + 5ND"

    def __init__(self, cfg: GMLPConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        n = self.seq_len()
        self.hidden = max(1, round(cfg.ffn_ratio * ctx.dim))
        self.proj_in = nn.Linear(ctx.dim, 2 * self.hidden)  # U: C -> 2D
        self.norm = nn.LayerNorm(self.hidden)
        self.spatial_weight = nn.Parameter(torch.empty(n, n))  # W: token n -> token m
        self.spatial_bias = nn.Parameter(torch.empty(n))
        self.proj_out = nn.Linear(self.hidden, ctx.dim)  # V: D -> C
        self.proj_drop = nn.Dropout(ctx.proj_drop)
        self.init_weights()

    def init_weights(self) -> None:
        """Near-identity gate: ``W ~ U(±eps/N)``, ``b = 1`` (paper, Sec. 2.1)."""
        eps = self.cfg.init_eps / self.spatial_weight.shape[0]
        nn.init.uniform_(self.spatial_weight, -eps, eps)
        nn.init.ones_(self.spatial_bias)

    def gate_params(self, grid: Grid) -> tuple[Tensor, Tensor]:
        """``W [N', N'], b [N']`` at ``grid`` (resampled if it is not the construction grid)."""
        w = self.token_param(self.spatial_weight, grid, dim=1, mass=True)  # input axis
        w = self.token_param(w, grid, dim=0)  # output axis
        return w, self.token_param(self.spatial_bias, grid, dim=0)

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        w, b = self.gate_params(grid)
        u, v = F.gelu(self.proj_in(x)).chunk(2, dim=-1)  # [B, N, D] each
        v = mix_tokens(self.norm(v), w, b)  # [B, N, D]: W · LN(Z₂) + b
        return self.proj_drop(self.proj_out(u * v))

    def reference(self, x: Tensor, grid: Grid) -> Tensor:
        w, b = self.gate_params(grid)
        z = F.gelu(x @ self.proj_in.weight.T + self.proj_in.bias)  # [B, N, 2D]
        z1, z2 = z[..., :self.hidden], z[..., self.hidden:]
        z2 = F.layer_norm(z2, (self.hidden,), self.norm.weight, self.norm.bias, self.norm.eps)
        gate = torch.einsum("mn,bnd->bmd", w, z2) + b[:, None]  # gate[m] = Σₙ W[m, n]·z₂[n] + b[m]
        return (z1 * gate) @ self.proj_out.weight.T + self.proj_out.bias

    def flops(self, grid: Optional[Grid] = None) -> int:
        grid = grid or self.grid
        n, c, d = self.seq_len(grid), self.dim, self.hidden
        total = n * c * 2 * d  # U: N×C times C×2D
        total += 5 * n * d  # LN(Z₂), affine LayerNorm: 5 per element (fvcore)
        total += d * n * n  # W · LN(Z₂): N×N times N×D
        total += n * d * c  # V: N×D times D×C
        # resampling W (input axis, then output axis) and b when grid is not the construction grid
        n0 = self.seq_len()
        total += self.token_param_flops(n0 * n0, grid) + self.token_param_flops(n * n0, grid)
        total += self.token_param_flops(n0, grid)
        return total

    def memory(self, grid: Optional[Grid] = None, batch: int = 1, amp: Optional[torch.dtype] = None,
               input_dtype: Optional[torch.dtype] = None) -> list[Saved]:
        """What a training forward keeps: the projections' inputs, the GELU's input and output (both halves), the
        norm's statistics, the token-axis linear's input and output (the gate), and the weights' autocast copies
        under ``amp`` (``W`` resampled at another grid). Args as :meth:`TokenMixer.memory`."""
        grid = grid or self.grid
        rows, c, d, size = batch * self.seq_len(grid), self.dim, self.hidden, itemsize(amp)
        n = self.seq_len(grid)
        items = [
            Saved("proj_in input", rows * c, size),  # [B, N, C]
            Saved("GELU input (proj_in output)", rows * 2 * d, size),  # [B, N, 2D]
            Saved("GELU output (Z₁|Z₂: the norm's input, the gate product's operand)", rows * 2 * d, size),
            Saved("norm mean (fp32)", rows, 4), Saved("norm rstd (fp32)", rows, 4),  # [B, N, 1] each
            Saved("spatial linear input (LN(Z₂), tokens last, a copy)", rows * d, size),  # [B·D, N]
            Saved("gate W·LN(Z₂) + b (spatial linear output)", rows * d, size),  # [B, D, N]
            Saved("proj_out input (Z₁ ⊙ gate)", rows * d, size),  # [B, N, D]
        ]
        if amp is not None:
            items += [Saved("proj_in weight (autocast copy)", 2 * d * c, size),  # [2D, C]
                      Saved("proj_out weight (autocast copy)", c * d, size)]  # [C, D]
        return items + self.token_param_memory("W", n * n, grid, amp)  # [N, N]

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        return {**super().symbols(grid), "D": self.hidden}
