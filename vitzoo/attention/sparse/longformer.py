"""Longformer attention on a 2-D token grid (``longformer``).

Papers: Beltagy et al., "Longformer: The Long-Document Transformer", arXiv 2020,
https://arxiv.org/abs/2004.05150; in 2-D: Zhang et al., "Multi-Scale Vision Longformer", ICCV 2021,
https://arxiv.org/abs/2103.15358.

Three parts, as in Longformer:

* sliding window: each grid token attends to the k×k window centred on it. Unlike ``local``, the
  window does not shift at the border: keys outside the grid are masked (Longformer pads), so
  border tokens see fewer keys while the cost (halo keys per query) does not shrink;
* dilated windows on ``attention.dilated_heads`` of the heads: k×k keys spaced δ apart, centred
  and masked the same way (δ shrinks per axis to ``side // k`` on small grids, DiNAT's rule);
* global tokens: the prefix tokens (ViT's class token) and g learned tokens of this layer. Every
  token attends to them; prefix queries attend to every token. In every layer the learned tokens
  first read the sequence (their queries attend to every token) and their states ``t + read`` give
  the keys and values, so global information flows in one layer (see :mod:`vitzoo.attention.sparse.pattern`).

Windows run as blocked (halo) attention per head group (:mod:`vitzoo.attention.sparse.halo`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, check, check_non_negative, check_positive
from vitzoo.attention.sparse import flex
from vitzoo.attention.sparse.geometry import Neighbourhood, check_odd_kernel
from vitzoo.attention.sparse.neighbourhood import GlobalNeighbourhoodAttention, check_num_global_option


@dataclass
class LongformerConfig:
    kernel_size: int = 3  # sliding-window side k (odd, <= the grid's shorter side)
    dilation: int = 2  # key stride δ of the dilated heads; shrinks per axis to side // k on small grids
    dilated_heads: int = 1  # heads (the last ones) using dilated windows, 0..num_heads
    num_global: int = 1  # learned global tokens g per layer (the class token is global as well)
    impl: str = "auto"  # auto (flex on CUDA, blocked elsewhere), blocked (halo/gathered) or flex (FlexAttention)

    def __post_init__(self):
        check_odd_kernel(self)
        flex.check_impl(self)
        check_positive(self, "dilation")
        check_non_negative(self, "dilated_heads")
        check_num_global_option(self)


@register_attention("longformer", LongformerConfig)
class LongformerAttention(GlobalNeighbourhoodAttention):
    """Sliding windows (masked at the border), dilated windows on some heads, global tokens.

    Its cost is :attr:`formula` (P prefix, g learned tokens; L_l/L_δ query slots of the blocked
    grid and K_l/K_δ halo keys per block of the sliding/dilated heads, C_l/C_δ their channels).

    Args:
        cfg: :class:`LongformerConfig`.
        ctx: the host's context.
    """

    formula = "4NC² + 3gC² + 2gNC + 2(K_l + P + g)L_lC_l + 2(K_δ + P + g)L_δC_δ + 2P(N + g)C"

    def __init__(self, cfg: LongformerConfig, ctx: MixerContext):
        check(cfg.dilated_heads <= ctx.num_heads,
              f"attention.dilated_heads={cfg.dilated_heads} exceeds the layer's {ctx.num_heads} heads "
              f"(model.num_heads); pick 0..{ctx.num_heads}")
        check(cfg.num_global > 0 or ctx.num_prefix > 0,
              "attention=longformer needs a global token: attention.num_global=0 on a model without a class token "
              "(Swin) leaves only sliding windows; set attention.num_global >= 1 or use attention=local")
        super().__init__(cfg, ctx)

    def head_patterns(self, grid: Grid) -> list[tuple[int, Optional[Neighbourhood]]]:
        k, dilated = self.cfg.kernel_size, self.cfg.dilated_heads
        return [(self.num_heads - dilated, Neighbourhood(k, 1, "mask")),
                (dilated, Neighbourhood(k, self.cfg.dilation, "mask"))]

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        (n_l, local), (n_d, dilated) = self.head_patterns(grid or self.grid)
        return {**super().symbols(grid), **self.halo_symbols(grid, local, "l"), **self.halo_symbols(grid, dilated, "δ"),
                "C_l": n_l * self.head_dim, "C_δ": n_d * self.head_dim}

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, dilation={self.dilation_at()} on {self.cfg.dilated_heads} heads")
