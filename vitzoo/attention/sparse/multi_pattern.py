"""Different fixed patterns on different heads (``multi_pattern``).

Papers: Child et al., "Generating Long Sequences with Sparse Transformers", arXiv 2019,
https://arxiv.org/abs/1904.10509 (heads with complementary local and strided patterns); Hassani &
Shi, "Dilated Neighborhood Attention Transformer", arXiv 2022, https://arxiv.org/abs/2209.15001
(local and dilated neighbourhoods mixed in one model).

``attention.patterns`` is a list of ``[pattern, heads]`` pairs, taken in head order:

* ``local``: k×k neighbourhood attention (shifted at the border, as ``local``);
* ``dilated``: k×k keys spaced δ apart (as ``dilated``; δ shrinks per axis to ``side // k``);
* ``global``: every grid token attends to every token (quadratic: a config with global heads has
  ``linear_cost`` false).

``heads`` is a positive integer, or null for "all remaining heads" (at most one entry; it may get
none, e.g. on a 2-head Swin stage). Without a null entry the heads must add up to the layer's
heads. Prefix tokens (ViT's class token) are global in every head: they attend to every token and
every token attends to them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, check, check_positive
from vitzoo.attention.sparse import flex
from vitzoo.attention.sparse.geometry import Neighbourhood, check_odd_kernel
from vitzoo.attention.sparse.neighbourhood import NeighbourhoodAttention

PATTERNS = ("local", "dilated", "global")


def parse_patterns(entries: Any) -> list[tuple[str, Optional[int]]]:
    """``[[pattern, heads], ...]`` (lists, tuples or OmegaConf lists) -> ``[(pattern, heads or None), ...]``."""
    check(isinstance(entries, Sequence) and not isinstance(entries, str) and len(entries) > 0,
          f"attention.patterns must be a non-empty list of [pattern, heads] pairs (got {entries!r})")
    out = []
    for i, entry in enumerate(entries):
        pair = list(entry) if isinstance(entry, Sequence) and not isinstance(entry, str) else []
        heads = pair[1] if len(pair) == 2 else 0
        ok = len(pair) == 2 and pair[0] in PATTERNS and (
            heads is None or (isinstance(heads, int) and not isinstance(heads, bool) and heads > 0))
        check(ok, f"attention.patterns[{i}] must be [pattern, heads] with pattern one of {', '.join(PATTERNS)} "
                  f"and heads a positive integer or null (got {entry!r})")
        out.append((pair[0], heads))
    check(sum(h is None for _, h in out) <= 1, "attention.patterns may leave heads null (= the rest) in one entry only")
    return out


@dataclass
class MultiPatternConfig:
    # [pattern, heads] pairs in head order; heads null = the remaining heads
    patterns: list = field(default_factory=lambda: [["local", None], ["dilated", 1], ["global", 1]])
    kernel_size: int = 3  # neighbourhood side k of local and dilated heads (odd, <= the grid's shorter side)
    dilation: int = 2  # key stride δ of dilated heads; shrinks per axis to side // k on small grids
    impl: str = "auto"  # auto (flex on CUDA, blocked elsewhere), blocked (halo/gathered) or flex (FlexAttention)

    def __post_init__(self):
        self.patterns = [list(p) for p in parse_patterns(self.patterns)]
        check_odd_kernel(self)
        flex.check_impl(self)
        check_positive(self, "dilation")


@register_attention("multi_pattern", MultiPatternConfig)
class MultiPatternAttention(NeighbourhoodAttention):
    """Head groups with local, dilated or global patterns.

    Its cost is :attr:`formula`: C_l, C_δ, C_g = d·(local, dilated, global heads), L = H·W,
    P prefix tokens; local and dilated heads run blocked (halo) attention with L_l/L_δ query slots
    and K_l/K_δ halo keys per block (:mod:`vitzoo.attention.sparse.halo`).

    Args:
        cfg: :class:`MultiPatternConfig`.
        ctx: the host's context.
    """

    formula = "4NC² + 2(K_l + P)L_lC_l + 2(K_δ + P)L_δC_δ + 2LNC_g + 2PNC"

    def __init__(self, cfg: MultiPatternConfig, ctx: MixerContext):
        self.head_counts = self.assign_heads(cfg.patterns, ctx.num_heads)
        super().__init__(cfg, ctx)
        self.setup()

    @classmethod
    def linear_in(cls, cfg: MultiPatternConfig, num_heads: int) -> bool:
        """Linear in N unless the global pattern gets heads (they score every key)."""
        counts = cls.assign_heads(cfg.patterns, num_heads)
        return all(n == 0 for (name, _), n in zip(cfg.patterns, counts) if name == "global")

    @staticmethod
    def assign_heads(patterns: list, num_heads: int) -> list[int]:
        """Heads per entry: explicit counts, the null entry gets the rest."""
        given = sum(h for _, h in patterns if h is not None)
        has_rest = any(h is None for _, h in patterns)
        check(given <= num_heads if has_rest else given == num_heads,
              f"attention.patterns assigns {given} heads but the layer has {num_heads} (model.num_heads); "
              f"make them add up or leave one entry's heads null")
        return [h if h is not None else num_heads - given for _, h in patterns]

    def head_patterns(self, grid: Grid) -> list[tuple[int, Optional[Neighbourhood]]]:
        k, dilation = self.cfg.kernel_size, self.cfg.dilation
        kinds = {"local": Neighbourhood(k), "dilated": Neighbourhood(k, dilation), "global": None}
        return [(n, kinds[name]) for (name, _), n in zip(self.cfg.patterns, self.head_counts)]

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        k, d = self.cfg.kernel_size, self.head_dim
        heads = {kind: sum(n for (name, _), n in zip(self.cfg.patterns, self.head_counts) if name == kind)
                 for kind in PATTERNS}
        return {**super().symbols(grid), "k": k, **self.halo_symbols(grid, Neighbourhood(k), "l"),
                **self.halo_symbols(grid, Neighbourhood(k, self.cfg.dilation), "δ"), "C_l": d * heads["local"],
                "C_δ": d * heads["dilated"], "C_g": d * heads["global"]}

    def extra_repr(self) -> str:
        heads = ", ".join(f"{name}×{n}" for (name, _), n in zip(self.cfg.patterns, self.head_counts))
        return (f"{super().extra_repr()}, patterns=[{heads}], kernel_size={self.cfg.kernel_size}, "
                f"dilation={self.dilation_at()}")
