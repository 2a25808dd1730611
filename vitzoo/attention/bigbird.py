"""BigBird block-sparse attention on a 2-D token grid (``bigbird``).

Paper: Zaheer et al., "Big Bird: Transformers for Longer Sequences", NeurIPS 2020,
https://arxiv.org/abs/2007.14062 (the ITC variant: existing tokens are global).

The grid is cut into b×b blocks (padded at the bottom/right when b does not divide it; padding
tokens are masked as keys and cropped). Each query block attends to

* window blocks: the w×w block neighbourhood around it, shifted at the border to stay inside the
  block grid (as Neighborhood Attention shifts); w shrinks per axis to the block grid;
* global blocks: ``attention.num_global_blocks`` blocks spread evenly over the raster order
  (2 = the first and last block, as BigBird-ITC). Their queries attend to every token and every
  query attends to them;
* r random blocks, drawn once at construction for every head separately (as the paper does) from
  the blocks outside its window and the global blocks, by a generator seeded with the layer index,
  and kept in the ``random_blocks`` buffer ``[h, blocks, r]`` (saved in checkpoints). A small grid may have fewer than r such blocks: then all of them are
  used (on Swin's 4×4 stage the pattern is dense), as HF BigBird falls back to full attention.
  At a grid other than the construction grid the draw is redone with the same seed.

Prefix tokens (ViT's class token) are global tokens too. Each head gathers its own keys (its
own random blocks) and all heads run together as fused SDPA calls over chunks of query blocks,
``[B, h·blocks, b², G + P + b²·(w² + r)]`` (see :func:`vitzoo.attention._gather.block_attention`);
never ``[B, h, N, N]``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from vitzoo.attention import _flex, register_attention
from vitzoo.attention._neighbourhood import check_odd_kernel, neighbourhood_index, neighbourhood_mask
from vitzoo.attention._sparse import HeadGroup, SparsePattern, SparsePatternAttention, block_count
from vitzoo.attention.base import Grid, MixerContext, check, check_non_negative, check_positive


@dataclass
class BigBirdConfig:
    block_size: int = 2  # block side b in tokens (<= the grid's shorter side; other grids are padded)
    window_blocks: int = 3  # side w of the block neighbourhood (odd; shrinks to the block grid)
    num_global_blocks: int = 1  # global blocks n_g, 0..blocks-1, spread over the raster order
    num_random: int = 2  # random blocks r per query block, 0..blocks-n_g-1
    impl: str = "auto"  # auto (flex on CUDA, blocked elsewhere), blocked (halo/gathered) or flex (FlexAttention)

    def __post_init__(self):
        check_positive(self, "block_size")
        _flex.check_impl(self)
        check_odd_kernel(self, "window_blocks")
        check_non_negative(self, "num_global_blocks", "num_random")


def global_block_ids(num_blocks: int, num_global: int) -> Tensor:
    """``[n_g]`` global block ids evenly spread over ``0..num_blocks-1`` (2 -> first and last)."""
    if num_global == 0:
        return torch.zeros(0, dtype=torch.long)
    return torch.linspace(0, num_blocks - 1, num_global).round().long()


def block_tokens(grid: Grid, block: int) -> Tensor:
    """``[blocks, b²]`` padded-grid ids of every block's tokens (blocks and tokens in raster order)."""
    nbh, nbw = block_count(grid, block)
    t = torch.arange(block)
    rows = torch.arange(nbh)[:, None] * block + t  # [nbh, b]
    cols = torch.arange(nbw)[:, None] * block + t  # [nbw, b]
    ids = rows[:, None, :, None] * (nbw * block) + cols[None, :, None, :]  # [nbh, nbw, b, b]
    return ids.reshape(nbh * nbw, block * block)


@register_attention("bigbird", BigBirdConfig)
class BigBirdAttention(SparsePatternAttention):
    """Block-sparse attention: window, global and random blocks.

    Its cost is :attr:`formula`: n_b blocks of the padded grid,
    n_g global blocks holding G real tokens, w² window blocks and r random blocks per query block
    (slots that end up masked are still computed and counted).

    Args:
        cfg: :class:`BigBirdConfig`.
        ctx: the host's context (``layer_index`` seeds the random blocks).
    """

    formula = "4NC² + 2(n_b - n_g)b²((w² + r)b² + G + P)C + 2(P + G)NC"

    def __init__(self, cfg: BigBirdConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        self.check_grid_fits(self.grid)
        self.register_buffer("random_blocks", self.draw_random(self.grid))
        self.setup()
        self.register_load_state_dict_post_hook(_rebuild_after_load)  # a loaded draw rebuilds the indices

    def check_grid_fits(self, grid: Grid) -> None:
        """Block size, global blocks and random blocks must be in range for ``grid``."""
        b, (H, W) = self.cfg.block_size, grid
        check(b <= min(grid), f"attention.block_size={b} is larger than the {H}x{W} token grid; "
                              f"pick attention.block_size <= {min(grid)}")
        nb = block_count(grid, b)[0] * block_count(grid, b)[1]
        n_g, r = self.cfg.num_global_blocks, self.cfg.num_random
        check(n_g <= nb - 1, f"attention.num_global_blocks={n_g} leaves no sparse block: the {H}x{W} grid has {nb} "
                             f"blocks of {b}x{b}; pick 0..{nb - 1}")
        check(r <= nb - n_g - 1, f"attention.num_random={r} exceeds the {nb - n_g - 1} non-global other blocks of the "
                                 f"{H}x{W} grid in {b}x{b} blocks; pick 0..{nb - n_g - 1}")

    def window_at(self, grid: Grid) -> Grid:
        """Block-neighbourhood side per axis at ``grid`` (clamped to the block grid)."""
        return tuple(min(self.cfg.window_blocks, n) for n in block_count(grid, self.cfg.block_size))

    def draw_random(self, grid: Grid) -> Tensor:
        """``[h, blocks, r]`` random block ids per head and query block (-1: none left), seeded by the layer index."""
        blocks = block_count(grid, self.cfg.block_size)
        nb, r = blocks[0] * blocks[1], self.cfg.num_random
        window, _ = neighbourhood_index(blocks, self.window_at(grid))  # [nb, w²]
        glob = global_block_ids(nb, self.cfg.num_global_blocks)
        gen = torch.Generator().manual_seed(self.layer_index)
        out = torch.full((self.num_heads, nb, r), -1, dtype=torch.long)
        for head in range(self.num_heads):
            for qb in range(nb):
                if qb in glob:
                    continue
                taken = torch.zeros(nb, dtype=torch.bool)
                taken[window[qb]] = True
                taken[glob] = True
                free = (~taken).nonzero().flatten()
                pick = free[torch.randperm(free.numel(), generator=gen)[:r]]
                out[head, qb, :pick.numel()] = pick
        return out

    def random_at(self, grid: Grid) -> Tensor:
        return self.random_blocks.cpu() if tuple(grid) == self.grid else self.draw_random(grid)

    def build_pattern(self, grid: Grid) -> SparsePattern:
        self.check_grid_fits(grid)
        b, (H, W) = self.cfg.block_size, grid
        blocks = block_count(grid, b)
        Hp, Wp, nb = blocks[0] * b, blocks[1] * b, blocks[0] * blocks[1]
        window, _ = neighbourhood_index(blocks, self.window_at(grid))  # [nb, w²]
        is_global = torch.zeros(nb, dtype=torch.bool)
        is_global[global_block_ids(nb, self.cfg.num_global_blocks)] = True
        sparse = (~is_global).nonzero().flatten()  # [Q] non-global query blocks
        tokens = block_tokens(grid, b)  # [nb, b²]
        real = ((torch.arange(Hp)[:, None] < H) & (torch.arange(Wp)[None, :] < W)).flatten()  # [L']
        rand = self.random_at(grid)  # [h, nb, r]
        slots = torch.cat([window.expand(rand.shape[0], -1, -1), rand], dim=2)  # [h, nb, T] attended block ids
        slot_ok = (slots >= 0) & ~is_global[slots.clamp(min=0)]  # global blocks are attended as global keys
        keys = tokens[slots[:, sparse].clamp(min=0)].flatten(2)  # [h, Q, T, b²] -> [h, Q, T·b²]
        valid = slot_ok[:, sparse].repeat_interleave(b * b, dim=2) & real[keys]  # [h, Q, T·b²]
        groups = [HeadGroup(self.num_heads, keys, valid)]  # one group, each head with its own random blocks
        glob_ids = tokens[is_global].flatten()
        glob_ids = glob_ids[real[glob_ids]]
        global_grid = (glob_ids // Wp) * W + glob_ids % Wp  # [G] raster ids in the unpadded grid
        return SparsePattern(grid, groups, padded=(Hp, Wp), queries=tokens[sparse], global_grid=global_grid)

    def grid_mask(self, grid: Grid) -> Tensor:
        """Block-level mask per head (window ranges, the head's random draw, global rows/columns) expanded to tokens."""
        allowed, block_of = self.block_tables(grid)  # [h, nb, nb], [L]
        return allowed[:, block_of[:, None], block_of[None, :]]  # [h, L, L]

    def flex_grid_mod(self, grid: Grid, device) -> _flex.GridMod:
        """Flex path: the block tables of :meth:`block_tables` looked up per token pair."""
        allowed, block_of = self.block_tables(grid)
        return _flex.block_tables_mod(allowed.to(device), block_of.to(device))

    def block_tables(self, grid: Grid) -> tuple[Tensor, Tensor]:
        """``allowed[h, nb, nb]`` (query block sees key block, per head) and ``block_of[L]`` (each grid token's block)."""
        b, (H, W) = self.cfg.block_size, grid
        blocks = block_count(grid, b)
        nb = blocks[0] * blocks[1]
        rand = self.random_at(grid)  # [h, nb, r]
        allowed = neighbourhood_mask(blocks, self.window_at(grid)).repeat(self.num_heads, 1, 1)  # [h, nb, nb]
        heads, rows, cols = (rand >= 0).nonzero(as_tuple=True)
        allowed[heads, rows, rand[heads, rows, cols]] = True
        glob = global_block_ids(nb, self.cfg.num_global_blocks)
        allowed[:, glob, :] = True
        allowed[:, :, glob] = True
        block_of = ((torch.arange(H) // b)[:, None] * blocks[1] + (torch.arange(W) // b)[None, :]).flatten()  # [L]
        return allowed, block_of

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        grid = grid or self.grid
        blocks = block_count(grid, self.cfg.block_size)
        pat = self.pattern_at(grid)
        wh, ww = self.window_at(grid)
        return {**super().symbols(grid), "N": self.seq_len(grid), "n_b": blocks[0] * blocks[1],
                "n_g": self.cfg.num_global_blocks, "b": self.cfg.block_size, "w²": wh * ww,
                "r": self.cfg.num_random, "G": pat.num_global_grid}

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, block_size={self.cfg.block_size}, window_blocks={self.window_at(self.grid)}, "
                f"num_global_blocks={self.cfg.num_global_blocks}, num_random={self.cfg.num_random}")


def _rebuild_after_load(module: "BigBirdAttention", incompatible_keys) -> None:
    """After ``load_state_dict``: rebuild the gather indices from the loaded random blocks.

    A module-level function, not a lambda, so that ``torch.save(model)`` can pickle the hook.
    """
    module.setup()
