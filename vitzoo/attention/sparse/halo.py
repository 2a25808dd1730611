"""Blocked (halo) neighbourhood attention: the blocks, halos and masks of the neighbourhood head groups.

Papers: Vaswani et al., "Scaling Local Self-Attention for Parameter Efficient Visual Backbones"
(HaloNet), CVPR 2021, https://arxiv.org/abs/2103.12731 (query blocks attending to a haloed key
block); the patterns are those of :mod:`vitzoo.attention.sparse.geometry` (NAT, DiNAT, Longformer).

Instead of gathering k² keys per query, the grid is cut into blocks of queries and each block
attends with dense matmuls to its halo: keys that cover every key of every query in the block.

* Per axis (:func:`axis_plan`), positions are split by residue mod δ into dilation sub-lattices
  (DiNAT's view: each is a plain neighbourhood problem, so a halo is not mostly masked) and each
  sub-lattice into runs of at most b consecutive positions, the query blocks. Each block gets a
  halo of ``hb = min(b + 2r, longest sub-lattice)`` positions of its sub-lattice (r = k // 2).
  A query's k keys span k consecutive sub-lattice positions and its block at most b, so
  ``b - 1 + k = b + 2r`` positions always hold them; the halo is placed over them, moved inward
  at the border. Slots past a short sub-lattice are padding.
* A 2-D block is a row block times a column block: ``S = b_H·b_W`` query slots and
  ``K = hb_H·hb_W`` halo slots. The boolean ``mask[blocks, S, K]`` keeps exactly the keys that
  :func:`axis_index` lists for each query (valid ones), so outputs are those of the gathered
  definition. Padding halo slots are masked; padding query slots repeat a real query of their
  block (no all-masked row) and their outputs are dropped.

:class:`HaloGroup` holds a head group's blocks, halos and masks; :func:`vitzoo.ops.halo.halo_attention` runs
them through :func:`vitzoo.ops.gather.block_attention` with flat ids per block,
which writes the outputs in raster order: on the CPU vitzoo's compiled kernel reads each block's rows
into cache, elsewhere queries, keys and values are cut with one ``index_select`` each (about
``(hb_H·hb_W)/(b_H·b_W)`` copies of K and V instead of k²). Global keys (prefix and learned tokens)
join every block's keys in front.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from vitzoo.attention.base import Grid
from vitzoo.attention.sparse.geometry import axis_index

# Query block side b per axis (clipped to the sub-lattice). Each query scores (b + 2r)² halo keys
# and K, V are copied (1 + 2r/b)² times: b = 4 and k = 3 give 36 keys and 2.25 copies (b = 8: 100
# keys, 1.56 copies). With b = 4 a 16x16 grid already has interior blocks, dilated or not, so the
# keys per query, hence the cost per token, stay the same from 16x16 up: the cost is linear in N.
BLOCK = 4


def axis_runs(n: int, dilation: int, block: int) -> list[Tensor]:
    """Query blocks along one axis: runs of at most ``block`` consecutive positions of each sub-lattice."""
    runs = []
    for residue in range(min(dilation, n)):
        pos = torch.arange(residue, n, dilation)  # one sub-lattice
        runs += [pos[s:s + block] for s in range(0, pos.numel(), block)]
    return runs


def run_halo(run: Tensor, idx: Tensor, valid: Tensor, n: int, dilation: int, width: int) -> Tensor:
    """``[width]`` positions of the halo of one query run (-1: padding past a short sub-lattice).

    Args:
        run: query positions of the block (one sub-lattice).
        idx, valid: ``[n, k]`` key positions and validity from :func:`axis_index`.
        n: axis length.
        dilation: δ.
        width: halo slots hb.
    """
    residue = int(run[0]) % dilation
    sub = torch.arange(residue, n, dilation)  # the run's sub-lattice
    first = int(idx[run][valid[run]].min()) // dilation  # sub-lattice position of the block's first key
    start = max(0, min(first, sub.numel() - width))
    slots = torch.arange(start, start + width)
    return torch.where(slots < sub.numel(), sub[slots.clamp(max=sub.numel() - 1)], torch.full_like(slots, -1))


def axis_plan(n: int, kernel: int, dilation: int, border: str,
              block: int = BLOCK) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Query blocks and halos along one axis.

    Args:
        n: axis length.
        kernel: keys per query along the axis (k).
        dilation: δ.
        border: ``"shift"`` or ``"mask"`` (see :func:`axis_index`).
        block: largest query block side b.

    Returns:
        ``queries[m, b]`` positions of each block's query slots, ``halo[m, hb]`` halo positions
        (-1: padding), ``mask[m, b, hb]`` (halo slot is a valid key of the query slot) and
        ``inverse[n]`` (the slot in ``m·b`` holding each position's output).
    """
    idx, valid = axis_index(n, kernel, dilation, border)  # [n, k]
    longest = -(-n // dilation)
    b = min(block, longest)
    width = min(b + 2 * (kernel // 2), longest)
    runs = axis_runs(n, dilation, b)
    queries = torch.stack([torch.cat([r, r[:1].expand(b - r.numel())]) for r in runs])  # [m, b]
    halo = torch.stack([run_halo(r, idx, valid, n, dilation, width) for r in runs])  # [m, hb]
    member = (idx[queries][:, :, None, :] == halo[:, None, :, None]) & valid[queries][:, :, None, :]  # [m, b, hb, k]
    assert bool((member.sum(dim=2) == valid[queries].long()).all()), "every valid key sits once in its block's halo"
    inverse = torch.empty(n, dtype=torch.long)
    for m, r in enumerate(runs):
        inverse[r] = m * b + torch.arange(r.numel())
    return queries, halo, member.any(dim=-1), inverse


def axis_offsets(queries: Tensor, halo: Tensor, kernel: int, dilation: int) -> Tensor:
    """``[m, b, hb]`` relative position ``(key - query) / δ + k - 1`` in ``0..2k-2`` (clamped where masked)."""
    offset = torch.div(halo[:, None, :] - queries[:, :, None], dilation, rounding_mode="floor")  # [m, b, hb]
    return (offset + kernel - 1).clamp(0, 2 * kernel - 2)


class HaloGroup(nn.Module):
    """Index and mask buffers of one neighbourhood head group at one grid.

    Args:
        heads: number of heads in the group.
        grid: (H, W).
        kernel: neighbourhood side k.
        dilation: per-axis dilation (δ_H, δ_W), already fitted to the grid.
        border: ``"shift"`` or ``"mask"``.
        offsets: also build ``rel[blocks, S, K]``, each (query, halo slot)'s index into a
            ``(2k-1)²`` relative-position table (NAT's bias), or not.
    """

    def __init__(self, heads: int, grid: Grid, kernel: int, dilation: Grid, border: str, offsets: bool = False):
        super().__init__()
        self.heads = heads
        rows_q, rows_k, rows_mask, rows_inv = axis_plan(grid[0], kernel, dilation[0], border)
        cols_q, cols_k, cols_mask, cols_inv = axis_plan(grid[1], kernel, dilation[1], border)
        # [m_H, m_W, b_H, b_W, hb_H, hb_W]
        mask = rows_mask[:, None, :, None, :, None] & cols_mask[None, :, None, :, None, :]
        (mh, bh), (mw, bw) = rows_q.shape, cols_q.shape
        self.register_buffer("mask", mask.reshape(mh * mw, bh * bw, -1), persistent=False)  # [blocks, S, K]
        rel = None
        if offsets:
            rel_h = axis_offsets(rows_q, rows_k, kernel, dilation[0])  # [m_H, b_H, hb_H]
            rel_w = axis_offsets(cols_q, cols_k, kernel, dilation[1])  # [m_W, b_W, hb_W]
            rel = rel_h[:, None, :, None, :, None] * (2 * kernel - 1) + rel_w[None, :, None, :, None, :]
            rel = rel.reshape(mh * mw, bh * bw, -1)  # [m_H, m_W, b_H, b_W, hb_H, hb_W] -> [blocks, S, K]
        self.register_buffer("rel", rel, persistent=False)
        W = grid[1]
        q_ids = rows_q[:, None, :, None] * W + cols_q[None, :, None, :]  # [m_H, m_W, b_H, b_W] raster ids
        k_ids = (
            rows_k.clamp(min=0)[:, None, :, None] * W + cols_k.clamp(min=0)[None, :, None, :]
        )  # [m_H, m_W, hb_H, hb_W]
        row_blk, row_slot = rows_inv // bh, rows_inv % bh  # [H] block row and slot row of each row's output
        col_blk, col_slot = cols_inv // bw, cols_inv % bw  # [W]
        out_ids = ((row_blk[:, None] * mw + col_blk[None, :]) * bh + row_slot[:, None]) * bw + col_slot[
            None, :
        ]  # [H, W]
        self.register_buffer("q_ids", q_ids.flatten(), persistent=False)  # [blocks·S]
        self.register_buffer("k_ids", k_ids.flatten(), persistent=False)  # [blocks·K]
        self.register_buffer("out_ids", out_ids.flatten(), persistent=False)  # [H·W] slot in blocks·S

    def query_slots(self) -> int:
        """Query slots of the blocked grid (real queries plus padding): ``blocks·S``."""
        return self.mask.shape[0] * self.mask.shape[1]

    def halo_keys(self) -> int:
        """Halo keys per block (every query slot scores all of them): K."""
        return self.mask.shape[2]


def halo_flops(group: HaloGroup, num_global: int, head_dim: int) -> int:
    """MACs of :func:`halo_attention` for one image: QKᵀ and AV of every query slot over K halo plus G global keys."""
    return 2 * group.heads * group.query_slots() * (group.halo_keys() + num_global) * head_dim
