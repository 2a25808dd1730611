"""Global tokens plus neighbourhood attention (``global_tokens``).

Papers: Ainslie et al., "ETC: Encoding Long and Structured Inputs in Transformers", EMNLP 2020,
https://arxiv.org/abs/2004.08483 (global-local attention with extra global tokens); Zhang et al.,
"Multi-Scale Vision Longformer", ICCV 2021, https://arxiv.org/abs/2103.15358 (global memory
tokens plus 2-D local attention in a ViT).

Global tokens are the prefix tokens (ViT's class token) and g learned tokens of this layer. Every
grid token attends to its k×k neighbourhood (shifted at the border, as ``local``; blocked halo
attention, see :mod:`vitzoo.attention.sparse.halo`) plus every global token. Prefix queries attend to
every token (P rows of length N). The host does not carry the learned tokens from layer to layer,
so in every layer they first read the sequence, as ETC's global tokens attend to the long input:
their queries attend to every token (g rows of length N, ``gC² + 2gNC``), and the states
``t + read`` give the keys and values every query attends to (``2gC²``). A far token therefore
reaches every query in one layer. With no class token (Swin) ``attention.num_global`` must be
at least 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, check
from vitzoo.attention.sparse import flex
from vitzoo.attention.sparse.geometry import Neighbourhood, check_odd_kernel
from vitzoo.attention.sparse.neighbourhood import GlobalNeighbourhoodAttention, check_num_global_option


@dataclass
class GlobalTokensConfig:
    kernel_size: int = 3  # neighbourhood side k of the local part (odd, <= the grid's shorter side)
    num_global: int = 1  # learned global tokens g per layer (the class token is global as well)
    impl: str = "auto"  # auto (flex on CUDA, blocked elsewhere), blocked (halo/gathered) or flex (FlexAttention)

    def __post_init__(self):
        check_odd_kernel(self)
        flex.check_impl(self)
        check_num_global_option(self)


@register_attention("global_tokens", GlobalTokensConfig)
class GlobalTokensAttention(GlobalNeighbourhoodAttention):
    """k×k neighbourhood attention plus P + g global tokens; its cost is :attr:`formula`.

    L_b: query slots of the blocked grid, K_b: halo keys per block (see ``local``).

    Args:
        cfg: :class:`GlobalTokensConfig`.
        ctx: the host's context.
    """

    formula = "4NC² + 3gC² + 2gNC + 2(K_b + P + g)L_bC + 2P(N + g)C"  # P prefix, g learned tokens

    def __init__(self, cfg: GlobalTokensConfig, ctx: MixerContext):
        check(cfg.num_global + ctx.num_prefix > 0,
              "attention.num_global=0 and the model has no class token, so there is no global token; "
              "set attention.num_global >= 1 or use attention=local")
        super().__init__(cfg, ctx)

    def head_patterns(self, grid: Grid) -> list[tuple[int, Optional[Neighbourhood]]]:
        return [(self.num_heads, Neighbourhood(self.cfg.kernel_size))]

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        return {**super().symbols(grid), **self.halo_symbols(grid, Neighbourhood(self.cfg.kernel_size), "b")}
