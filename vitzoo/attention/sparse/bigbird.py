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
  and kept in the ``random_blocks`` buffer ``[h, blocks, r]`` (saved in checkpoints).
  A small grid may have fewer than r such blocks: then all of them are
  used (on Swin's 4×4 stage the pattern is dense), as HF BigBird falls back to full attention.
  At a grid other than the construction grid the draw is redone with the same seed.

Prefix tokens (ViT's class token) are global tokens too. Query blocks are grouped into tiles of
t×t blocks (``attention.tile_blocks``, clamped per axis to the block grid; a short last run of
blocks repeats its first block) whose t²b² queries share one key list: the G + P global keys,
the tile's window halo (the (t + w - 1)² blocks that hold its blocks' windows) and the r random
blocks of each of its blocks, per head. Each query is masked to exactly its own block's window
and random blocks, so the outputs are those of the per-block definition; the masked slots are
computed (w = 3, r = 2, t = 2: each query scores 96 keys besides the global ones, 44 of them
seen, instead of 44 at t = 1, but the matmuls are 4× larger and K, V are gathered 6 times
instead of 11: faster). Tiles of global blocks only are skipped; a tile's other global blocks
are computed with it and their outputs replaced by the global rows. The tiles run through
:func:`vitzoo.ops.gather.block_attention`: on the CPU vitzoo's compiled kernel, one task per
(image, head) over its tiles' t²b² queries and G + P + b²·((t + w - 1)² + t²r) keys; elsewhere fused
SDPA calls over chunks of tiles, ``[B, h·tiles, t²b², G + P + b²·((t + w - 1)² + t²r)]``; never
``[B, h, N, N]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, check, check_non_negative, check_positive
from vitzoo.attention.sparse import flex
from vitzoo.attention.sparse.geometry import check_odd_kernel, neighbourhood_index, neighbourhood_mask
from vitzoo.attention.sparse.halo import axis_plan
from vitzoo.attention.sparse.memory import pattern_memory
from vitzoo.attention.sparse.pattern import HeadGroup, SparsePattern, SparsePatternAttention, block_count, raster_ids
from vitzoo.costs import Saved
from vitzoo.ops.gather import global_mask


@dataclass
class BigBirdConfig:
    block_size: int = 2  # block side b in tokens (<= the grid's shorter side; other grids are padded)
    window_blocks: int = 3  # side w of the block neighbourhood (odd; shrinks to the block grid)
    num_global_blocks: int = 1  # global blocks n_g, 0..blocks-1, spread over the raster order
    num_random: int = 2  # random blocks r per query block, 0..blocks-n_g-1
    tile_blocks: int = 2  # query tiles of t×t blocks share one key list (fused calls of t²b² queries)
    impl: str = "auto"  # auto (flex on CUDA, blocked elsewhere), blocked (halo/gathered) or flex (FlexAttention)

    def __post_init__(self):
        check_positive(self, "block_size", "tile_blocks")
        flex.check_impl(self)
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

    Its cost is :attr:`formula`: n_t query tiles of t² = t_H·t_W blocks of b×b tokens, each
    over h_t = (t_H + w_H - 1)(t_W + w_W - 1) halo blocks and r random blocks per tile block, G real
    tokens of the global blocks and P prefix tokens (slots that end up masked are still computed
    and counted; t and w are clamped per axis to the block grid).

    Args:
        cfg: :class:`BigBirdConfig`.
        ctx: the host's context (``layer_index`` seeds the random blocks).
    """

    formula = "4NC² + 2n_t·t²b²((h_t + t²r)b² + G + P)C + 2(P + G)NC"

    def __init__(self, cfg: BigBirdConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        self.check_grid_fits(self.grid)
        self.register_buffer("random_blocks", self.draw_random(self.grid))
        self.setup()
        self.register_load_state_dict_post_hook(_rebuild_after_load)  # a loaded draw rebuilds the indices

    def check_grid_fits(self, grid: Grid) -> None:
        """Block size, global blocks and random blocks must be in range for ``grid``."""
        b, (H, W) = self.cfg.block_size, grid
        check(
            b <= min(grid),
            f"attention.block_size={b} is larger than the {H}x{W} token grid; pick attention.block_size <= {min(grid)}",
        )
        nb = block_count(grid, b)[0] * block_count(grid, b)[1]
        n_g, r = self.cfg.num_global_blocks, self.cfg.num_random
        check(
            n_g <= nb - 1,
            f"attention.num_global_blocks={n_g} leaves no sparse block: the {H}x{W} grid has {nb} "
            f"blocks of {b}x{b}; pick 0..{nb - 1}",
        )
        check(
            r <= nb - n_g - 1,
            f"attention.num_random={r} exceeds the {nb - n_g - 1} non-global other blocks of the "
            f"{H}x{W} grid in {b}x{b} blocks; pick 0..{nb - n_g - 1}",
        )

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
                out[head, qb, : pick.numel()] = pick
        return out

    def random_at(self, grid: Grid) -> Tensor:
        return self.random_blocks.cpu() if tuple(grid) == self.grid else self.draw_random(grid)

    def tile_at(self, grid: Grid) -> tuple[Tensor, Tensor, Tensor]:
        """Query tiles of t×t blocks and their window halos at ``grid`` (block ids, raster order of blocks).

        Per axis, runs of at most t blocks (:func:`~vitzoo.attention.sparse.halo.axis_plan` on the block
        grid, kernel w, no dilation, shifted border): the w-block windows of a run's blocks span at
        most ``t + w - 1`` consecutive blocks, its halo. A short last run repeats its first block.

        Returns:
            ``tiles[Q, T]`` block ids of each tile (T = t_H·t_W), ``halo[Q, T_h]`` the halo's block
            ids (T_h = (t_H + w_H - 1)(t_W + w_W - 1), clamped to the block grid) and
            ``inside[Q, T, T_h]`` (halo block is in the tile block's window).
        """
        blocks, window = block_count(grid, self.cfg.block_size), self.window_at(grid)
        rows_t, rows_h, rows_in, _ = axis_plan(blocks[0], window[0], 1, "shift", self.cfg.tile_blocks)
        cols_t, cols_h, cols_in, _ = axis_plan(blocks[1], window[1], 1, "shift", self.cfg.tile_blocks)
        (mh, th), (mw, tw) = rows_t.shape, cols_t.shape
        tiles = rows_t[:, None, :, None] * blocks[1] + cols_t[None, :, None, :]  # [m_H, m_W, t_H, t_W]
        halo = rows_h[:, None, :, None] * blocks[1] + cols_h[None, :, None, :]  # [m_H, m_W, hb_H, hb_W]
        inside = (
            rows_in[:, None, :, None, :, None] & cols_in[None, :, None, :, None, :]
        )  # [m_H, m_W, t_H, t_W, hb_H, hb_W]
        return tiles.reshape(mh * mw, th * tw), halo.reshape(mh * mw, -1), inside.reshape(mh * mw, th * tw, -1)

    def build_pattern(self, grid: Grid) -> SparsePattern:
        """Each tile's queries over one key list: the global keys, its halo's tokens, its blocks' random blocks.

        A query sees the halo blocks in its own block's window and only its own block's random
        blocks (mask); global blocks and padding tokens are masked there (global blocks are keys in
        front). Tiles of global blocks only are dropped; the other tiles compute their global
        blocks' queries too, whose outputs are replaced by the global rows.
        """
        self.check_grid_fits(grid)
        b, (H, W) = self.cfg.block_size, grid
        blocks = block_count(grid, b)
        Hp, Wp, nb = blocks[0] * b, blocks[1] * b, blocks[0] * blocks[1]
        is_global = torch.zeros(nb, dtype=torch.bool)
        is_global[global_block_ids(nb, self.cfg.num_global_blocks)] = True
        tiles, halo, inside = self.tile_at(grid)  # [Q, T], [Q, T_h], [Q, T, T_h]
        keep = ~is_global[tiles].all(dim=1)  # tiles of global blocks only: all their queries are global
        tiles, halo, inside = tiles[keep], halo[keep], inside[keep]
        rand = self.random_at(grid)[:, tiles]  # [h, Q, T, r]
        h, Q, T, _ = rand.shape
        rand_ok = (rand >= 0) & ~is_global[rand.clamp(min=0)]  # global blocks are attended as global keys
        own = torch.eye(T, dtype=torch.bool)[:, :, None]  # [T, T, 1]: block j sees the random slots of block j
        slots = torch.cat([halo.expand(h, -1, -1), rand.clamp(min=0).flatten(2)], dim=2)  # [h, Q, T_h + T·r] block ids
        seen = torch.cat(
            [(inside & ~is_global[halo][:, None, :]).expand(h, -1, -1, -1), (own & rand_ok[:, :, None]).flatten(3)],
            dim=3,
        )  # [h, Q, T, T_h + T·r]
        tokens = block_tokens(grid, b)  # [nb, b²]
        real = ((torch.arange(Hp)[:, None] < H) & (torch.arange(Wp)[None, :] < W)).flatten()  # [L']
        keys = tokens[slots].flatten(2)  # [h, Q, T_h + T·r, b²] -> [h, Q, K] padded ids
        mask = seen.repeat_interleave(b * b, dim=3) & real[keys][:, :, None]  # [h, Q, T, K]
        mask = mask.repeat_interleave(b * b, dim=2)  # [h, Q, S, K], S = T·b² queries block by block
        glob_ids = tokens[is_global].flatten()
        global_grid = raster_ids(glob_ids[real[glob_ids]], grid, (Hp, Wp))  # [G] raster ids of the global blocks
        front = self.num_prefix  # every query's keys first: the prefix tokens and the global blocks' tokens
        glob = torch.cat([torch.arange(front), front + global_grid])  # [P + G] ids into every key
        keys = torch.cat([glob.expand(h, Q, -1), front + raster_ids(keys, grid, (Hp, Wp))], dim=2)  # [h, Q, P + G + K]
        mask = global_mask(mask[0] if bool((mask == mask[:1]).all()) else mask, glob.numel())  # [(h,) Q, S, P + G + K]
        groups = [HeadGroup(h, keys, mask)]  # one group, each head with its own random blocks
        return SparsePattern(grid, groups, padded=(Hp, Wp), queries=tokens[tiles].flatten(1), global_grid=global_grid)

    def grid_mask(self, grid: Grid) -> Tensor:
        """Block-level mask per head (window ranges, the head's random draw, global rows/columns) expanded to tokens."""
        allowed, block_of = self.block_tables(grid)  # [h, nb, nb], [L]
        return allowed[:, block_of[:, None], block_of[None, :]]  # [h, L, L]

    def flex_grid_mod(self, grid: Grid, device) -> flex.GridMod:
        """Flex path: the block tables of :meth:`block_tables` looked up per token pair."""
        allowed, block_of = self.block_tables(grid)
        return flex.block_tables_mod(allowed.to(device), block_of.to(device))

    def block_tables(self, grid: Grid) -> tuple[Tensor, Tensor]:
        """``allowed[h, nb, nb]`` (query block sees key block, per head)
        and ``block_of[L]`` (each grid token's block)."""
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

    def attend_memory(self, grid: Grid, batch: int, amp: Optional[torch.dtype]) -> list[Saved]:
        """The tiles' saved tensors (:func:`vitzoo.attention.sparse.memory.pattern_memory`): q, k, v storages, the
        global rows' SDPA and, on the autograd-function path, the tiles' log-sum-exp."""
        return pattern_memory(self, grid, batch, amp)

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        grid = grid or self.grid
        pat = self.pattern_at(grid)
        tiles, halo, _ = self.tile_at(grid)
        return {
            **super().symbols(grid),
            "N": self.seq_len(grid),
            "n_t": pat.group_shape()[0],
            "t²": tiles.shape[1],
            "h_t": halo.shape[1],
            "b": self.cfg.block_size,
            "r": self.cfg.num_random,
            "G": pat.num_global_grid,
        }

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, block_size={self.cfg.block_size}, window_blocks={self.window_at(self.grid)}, "
            f"num_global_blocks={self.cfg.num_global_blocks}, num_random={self.cfg.num_random}, "
            f"tile_blocks={self.cfg.tile_blocks}"
        )


def _rebuild_after_load(module: "BigBirdAttention", incompatible_keys) -> None:
    """After ``load_state_dict``: rebuild the gather indices from the loaded random blocks.

    A module-level function, not a lambda, so that ``torch.save(model)`` can pickle the hook.
    """
    module.setup()
