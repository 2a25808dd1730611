"""Dilated neighbourhood attention (``dilated``).

Paper: Hassani & Shi, "Dilated Neighborhood Attention Transformer", arXiv 2022,
https://arxiv.org/abs/2209.15001. ``local``'s k×k neighbourhood with keys spaced δ apart (see
:mod:`vitzoo.attention.sparse.local`), with the paper's relative position bias: one learned ``(2k−1)²`` table
per head indexed by the key's offset in steps of δ (``attention.rel_pos_bias: false`` drops it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, check_positive
from vitzoo.attention.sparse import flex
from vitzoo.attention.sparse.geometry import check_odd_kernel
from vitzoo.attention.sparse.local import LocalAttention, check_rel_pos_bias


@dataclass
class DilatedConfig:
    kernel_size: int = 3  # neighbourhood side k (odd, <= the grid's shorter side)
    dilation: int = 2  # stride δ between keys; shrinks per axis to side // k on small grids
    rel_pos_bias: bool = True  # DiNAT's relative position bias (the paper's): a (2k-1)² table per head, in δ steps
    impl: str = "auto"  # auto (flex on CUDA, blocked elsewhere), blocked (halo/gathered) or flex (FlexAttention)

    def __post_init__(self):
        check_odd_kernel(self)
        flex.check_impl(self)
        check_positive(self, "dilation")
        check_rel_pos_bias(self)



@register_attention("dilated", DilatedConfig)
class DilatedAttention(LocalAttention):
    """Dilated neighbourhood attention: k×k keys spaced δ apart (δ fitted per axis to the grid).

    Its cost is :attr:`formula`, as ``local``; blocks and halos are cut per dilation sub-lattice,
    so a halo holds only keys of its queries' sub-lattice.

    Args:
        cfg: :class:`DilatedConfig`.
        ctx: the host's context.
    """

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        dh, dw = self.dilation_at(grid)
        return {**super().symbols(grid), "δ_H": dh, "δ_W": dw}
