"""Shared machinery of the fixed sparse-pattern backends.

Used by ``local``, ``dilated`` (:mod:`vitzoo.attention.sparse.local`), ``global_tokens``, ``longformer``,
``bigbird`` and ``multi_pattern``. A pattern is fixed by the grid, so it is built once into index
buffers (:class:`SparsePattern`) and the forward pass only gathers and multiplies:

* Neighbourhood head groups (``local``, ``dilated``, ``global_tokens``, ``longformer``,
  ``multi_pattern``'s local/dilated heads) run blocked (halo) attention (:mod:`vitzoo.attention.sparse.halo`):
  b×b query blocks attend to their halo of K keys with an exact boolean mask. BigBird's Q blocks
  of S queries share one list of K keys per head, gathered from the keys of every token. Both run
  as fused SDPA calls over chunks of blocks (:func:`vitzoo.ops.gather.block_attention`),
  whose backward gathers the blocks again and recomputes their probabilities (saved: the log-sum-exp).
  ``attention.impl=flex`` runs the same pattern through FlexAttention (:mod:`vitzoo.attention.sparse.flex`).
* G global keys are seen by every query: the prefix tokens (ViT's class token), learned global
  tokens and BigBird's global blocks.
* Global queries (prefix tokens, BigBird's global blocks) attend to every key through SDPA: ``P + G`` rows
  of length N. These calls and the learned tokens' read hold k, v into backward: q has its own buffer (``separate_q``).
* Keys that must not count (outside the grid under Longformer's border rule, padding tokens,
  blocks already covered, halo slots outside a query's neighbourhood) are masked with ``-inf``
  before the softmax; they are still computed and counted in ``flops``.

Learned global tokens t (ETC's global memory) read the sequence in every layer (the host carries only ``P + H·W``
tokens between layers): their queries attend to every token (g rows of length N) and the state ``s = t + read``
gives the keys and values (``2gC²`` per image) every query attends to. The reference reads densely and appends
the states' keys and values as ordinary tokens to a dense masked attention.

Global rows with their own projection (``qkv_global``, None unless ``longformer``'s
``attention.global_projections: separate`` sets it): the prefix rows and the learned tokens' read take queries,
keys and values from it (the states' too, where prefix rows score them); the grid rows keep ``qkv``.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import Tensor, nn

from vitzoo.attention.base import Grid, MixerContext, QKVAttention
from vitzoo.attention.functional import dense_attention, sdpa, sdpa_flops
from vitzoo.attention.sparse import flex
from vitzoo.attention.sparse.halo import HaloGroup, halo_flops
from vitzoo.ops import dispatch
from vitzoo.ops.gather import block_attention, head_parts, select_rows, split_prefix
from vitzoo.ops.halo import halo_attention


class HeadGroup(nn.Module):
    """Consecutive heads that share one key list per query group.

    Args:
        heads: number of heads in the group.
        keys: ``[Q, K]`` ids into every key (the P + g front keys, then the grid tokens in raster
            order) of each query group's keys, or ``[heads, Q, K]`` per head (BigBird's random
            blocks); None: the group's grid queries attend densely to every key (``multi_pattern``'s
            global heads).
        mask: booleans ``[Q, S or 1, K]`` or ``[heads, Q, S or 1, K]`` (False: the query does not see
            the key; no all-False row); None with ``keys`` None.
    """

    def __init__(self, heads: int, keys: Optional[Tensor] = None, mask: Optional[Tensor] = None):
        super().__init__()
        self.heads = heads
        self.register_buffer("keys", keys, persistent=False)
        self.register_buffer("mask", mask, persistent=False)


class SparsePattern(nn.Module):
    """Index buffers of one fixed pattern at one token grid.

    Args:
        grid: (H, W).
        groups: head groups in head order (heads sum to h): :class:`HeadGroup` (gathered keys or
            dense heads) or :class:`~vitzoo.attention.sparse.halo.HaloGroup` (blocked neighbourhood heads).
        padded: grid the ids in ``queries`` refer to (the grid padded to whole blocks).
        queries: ``[Q, S]`` padded ids of the grid queries of each gathered group (BigBird's blocks);
            None: outputs come in raster order, one per grid token (Q = H·W, S = 1).
        global_grid: ``[G]`` raster ids of grid tokens that are global (their queries attend to
            every key, every query attends to their keys); None: none.
    """

    def __init__(self, grid: Grid, groups: list[HeadGroup], padded: Optional[Grid] = None,
                 queries: Optional[Tensor] = None, global_grid: Optional[Tensor] = None):
        super().__init__()
        self.grid, self.padded = tuple(grid), tuple(padded or grid)
        self.groups = nn.ModuleList(groups)
        self.num_global_grid = 0 if global_grid is None else global_grid.numel()
        self.register_buffer("queries", queries, persistent=False)
        self.register_buffer("global_grid", global_grid, persistent=False)
        self.register_buffer("inverse", self._inverse() if queries is not None else None, persistent=False)
        rows = None if queries is None else raster_ids(queries, self.grid, self.padded)  # [Q, S]
        self.register_buffer("query_rows", rows, persistent=False)

    def _inverse(self) -> Tensor:
        """``[H·W]``: where each grid token's output sits in ``cat(group outputs [Q·S], global outputs [G])``."""
        (H, W), (Hp, Wp) = self.grid, self.padded
        slot = torch.full((Hp * Wp,), -1, dtype=torch.long)
        slot[self.queries.flatten()] = torch.arange(self.queries.numel())
        real = (torch.arange(H)[:, None] * Wp + torch.arange(W)[None, :]).flatten()  # padded id of each grid token
        inverse = slot[real]
        if self.global_grid is not None:
            inverse[self.global_grid] = self.queries.numel() + torch.arange(self.global_grid.numel())
        assert bool((inverse >= 0).all()), "every grid token needs an output"
        return inverse

    def group_shape(self) -> tuple[int, int]:
        """(Q, S): query groups and tokens per group."""
        if self.queries is None:
            return self.grid[0] * self.grid[1], 1
        return tuple(self.queries.shape)


def raster_ids(ids: Tensor, grid: Grid, padded: Grid) -> Tensor:
    """Ids into the ``padded`` grid as raster ids of ``grid`` (0 for padding tokens, which are masked or dropped)."""
    (H, W), (_, Wp) = grid, padded
    rows, cols = ids // Wp, ids % Wp
    return torch.where((rows < H) & (cols < W), rows * W + cols, 0)


# ----------------------------------------------------------------------------------- base class
class SparsePatternAttention(QKVAttention):
    """Base of the fixed sparse-pattern backends (see the module docstring).

    Subclasses call :meth:`setup` at the end of ``__init__`` and implement :meth:`build_pattern`
    (index buffers at a grid) and :meth:`grid_mask` (the same pattern as a boolean mask, for the
    reference). Prefix tokens are always global: their queries attend to every token and every
    query attends to their keys.

    Args:
        cfg: the backend's config.
        ctx: the host's context.
        num_learned: learned global tokens g (keys/values seen by every query).
    """

    impls = flex.IMPLS  # attention.impl: auto, blocked or flex
    linear_cost = True

    def __init__(self, cfg: Any, ctx: MixerContext, num_learned: int = 0):
        super().__init__(cfg, ctx)
        self.num_learned = num_learned
        self.global_tokens = nn.Parameter(torch.zeros(num_learned, ctx.dim)) if num_learned else None
        if self.global_tokens is not None:
            trunc_normal_(self.global_tokens, std=0.02)
        self.qkv_global: Optional[nn.Linear] = None  # the global rows' own projection (see the module docstring)

    def setup(self) -> None:
        """Build the pattern's index buffers for the construction grid (on the module's device)."""
        self.pattern = self.build_pattern(self.grid).to(self.qkv.weight.device)
        self._other_grids: dict[tuple, SparsePattern] = {}  # patterns at other grids, by (grid, device)
        flex.forget(self)  # FlexAttention block masks of an earlier pattern
        self.separate_q = bool(self.num_learned or self.num_prefix or self.pattern.num_global_grid)  # see module doc

    def build_pattern(self, grid: Grid) -> SparsePattern:  # pragma: no cover - abstract
        raise NotImplementedError

    def grid_mask(self, grid: Grid) -> Tensor:  # pragma: no cover - abstract
        """Boolean ``[h or 1, H·W, H·W]``: which grid keys each grid query attends to."""
        raise NotImplementedError

    def pattern_at(self, grid: Grid, device: Any = "cpu") -> SparsePattern:
        """The buffers at ``grid``: stored for the construction grid, built once and cached otherwise."""
        grid = tuple(grid)
        if grid == self.grid:
            return self.pattern
        key = (grid, str(device))
        if key not in self._other_grids:
            self._other_grids[key] = self.build_pattern(grid).to(device)
        return self._other_grids[key]

    def learned_kv(self, k: Tensor, v: Tensor, p_drop: float,
                   kv_glob: Optional[tuple[Tensor, Tensor]] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Keys and values ``[B, h, g, d]`` of the learned global tokens after they read the sequence.

        Args:
            k, v: ``[B, h, N, d]`` keys and values of every token (prefix and grid) from ``qkv``.
            p_drop: attention dropout of the read.
            kv_glob: keys and values ``[B, h, N, d]`` of every token from ``qkv_global``; None: no such projection.

        Returns:
            ``k_mem, v_mem`` (the states through ``qkv``: what grid rows see) and ``kg_mem, vg_mem`` (through
            ``qkv_global``: what prefix rows see; ``k_mem, v_mem`` again without ``kv_glob`` or prefix tokens).
            With ``kv_glob`` the read itself is ``qkv_global``'s too.
        """
        B, h, _, d = k.shape
        C, g = self.dim, self.num_learned
        if not g:
            empty = k.new_zeros(B, h, 0, d)
            return empty, empty, empty, empty
        read_proj, (k_read, v_read) = (self.qkv, (k, v)) if kv_glob is None else (self.qkv_global, kv_glob)
        w, bias = read_proj.weight, read_proj.bias
        q_mem = F.linear(self.global_tokens, w[:C], None if bias is None else bias[:C])  # queries: [g, C]
        q_mem = q_mem.view(g, h, d).transpose(0, 1).expand(B, -1, -1, -1)  # [g, h, d] -> [B, h, g, d]
        read = sdpa(q_mem, k_read, v_read, dropout_p=p_drop)  # g queries over every token: [B, h, g, d]
        state = self.global_tokens + read.transpose(1, 2).reshape(B, g, C)  # [B, g, C]
        w, bias = self.qkv.weight, self.qkv.bias
        kv = F.linear(state, w[C:], None if bias is None else bias[C:])  # keys and values: [B, g, 2C]
        k_mem, v_mem = self.to_heads(kv, 2)  # [B, h, g, d] each
        if kv_glob is None or not self.num_prefix:
            return k_mem, v_mem, k_mem, v_mem
        w, bias = self.qkv_global.weight, self.qkv_global.bias
        kv = F.linear(state, w[C:], None if bias is None else bias[C:])  # the prefix rows' keys and values: [B, g, 2C]
        return (k_mem, v_mem, *self.to_heads(kv, 2))

    def every_key(self, k: Tensor, k_mem: Tensor) -> Tensor:
        """``[B, h, P + g + L, d]``: prefix keys, the learned tokens' keys ``k_mem``, grid keys
        (``k`` itself when g = 0)."""
        P = self.num_prefix
        return torch.cat([k[:, :, :P], k_mem, k[:, :, P:]], dim=2) if k_mem.shape[2] else k

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid,
               kv_glob: Optional[tuple[Tensor, Tensor]] = None) -> Tensor:
        """``q, k, v[B, h, P + H·W, d] -> [B, h, P + H·W, d]`` computing only the pattern (``attention.impl``).

        Args:
            q, k, v: every token's queries, keys and values.
            grid: (H, W).
            kv_glob: keys and values ``[B, h, P + H·W, d]`` of every token from ``qkv_global`` (q's prefix rows are
                then its queries); None: every row uses q, k, v.
        """
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        impl = dispatch.select("sparse_pattern", self.cfg.impl, q.device, self.training, self.attn_drop.p, needs_grad)
        if impl == "flex":
            return self.attend_flex(q, k, v, grid, kv_glob)
        pat = self.pattern_at(grid, q.device)
        assert kv_glob is None or not pat.num_global_grid, "qkv_global covers prefix and learned rows only"
        P = self.num_prefix
        p_drop = self.attn_drop.p if self.training else 0.0
        (q_pre, q_grid), (k_pre, k_grid), (v_pre, v_grid) = (split_prefix(t, P) for t in (q, k, v))
        k_mem, v_mem, kg_mem, vg_mem = self.learned_kv(k, v, p_drop, kv_glob)  # [B, h, g, d]
        q_glob, k_glob, v_glob = q_pre, torch.cat([k_pre, k_mem], dim=2), torch.cat([v_pre, v_mem], dim=2)
        if pat.num_global_grid:
            gg = pat.global_grid
            q_glob = torch.cat([q_pre, q_grid[:, :, gg]], dim=2)  # [B, h, P + G_grid, d]
            k_glob = torch.cat([k_glob, k_grid[:, :, gg]], dim=2)  # [B, h, P + g + G_grid, d]
            v_glob = torch.cat([v_glob, v_grid[:, :, gg]], dim=2)
        halo = all(isinstance(group, HaloGroup) for group in pat.groups)  # halo groups take k_glob, not k_all
        rows_read_all = q_glob.shape[2] and kv_glob is None  # the global rows read k_all, v_all
        if halo and not rows_read_all:
            k_all, v_all = k, v
        else:
            k_all, v_all = self.every_key(k, k_mem), self.every_key(v, v_mem)
        # global queries attend to every key: P + G_grid rows (with kv_glob: its keys and values)
        k_rows, v_rows = (k_all, v_all) if kv_glob is None else (self.every_key(kv_glob[0], kg_mem),
                                                                 self.every_key(kv_glob[1], vg_mem))
        o_glob = sdpa(q_glob, k_rows, v_rows, dropout_p=p_drop) if q_glob.shape[2] else q_glob
        sizes = [group.heads for group in pat.groups]
        parts = zip(*(head_parts(t, sizes) for t in (q_grid, k_grid, v_grid, k_glob, v_glob, k_all, v_all)))
        outs, h0 = [], 0
        for group, (q_g, k_g, v_g, kg_g, vg_g, ka_g, va_g) in zip(pat.groups, parts):
            hs = slice(h0, h0 + group.heads)
            h0 += group.heads
            if isinstance(group, HaloGroup):  # neighbourhood heads: blocked attention over halos
                outs.append(
                    halo_attention(
                        q_g, k_g, v_g, group, kg_g, vg_g, self.scale, self.attn_drop, self.halo_bias(group, hs)
                    ).unsqueeze(3)
                )
            elif group.keys is None:  # dense heads: every grid query over every key
                outs.append(sdpa(q_g, ka_g, va_g, dropout_p=p_drop).unsqueeze(3))
            else:
                outs.append(self.gathered(q_g, ka_g, va_g, pat, group))
        o_grid = (torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]).flatten(2, 3)  # [B, h, Q·S, d]
        o_pre, o_gg = o_glob.split([P, pat.num_global_grid], dim=2)
        if pat.inverse is not None:
            o_grid = select_rows(torch.cat([o_grid, o_gg], dim=2), pat.inverse)  # [B, h, L, d] raster order
        return torch.cat([o_pre, o_grid], dim=2) if P else o_grid

    def attend_flex(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid,
                    kv_glob: Optional[tuple[Tensor, Tensor]] = None) -> Tensor:
        """The same pattern as one FlexAttention call (:mod:`vitzoo.attention.sparse.flex`): ``[B, h, P + L, d]``.

        With ``kv_glob`` (see :meth:`attend`) the call covers the grid rows only and the prefix rows run
        through SDPA over ``kv_glob`` and the states' keys and values from ``qkv_global``.
        """
        p_drop = self.attn_drop.p if self.training else 0.0
        k_mem, v_mem, kg_mem, vg_mem = self.learned_kv(k, v, p_drop, kv_glob)  # [B, h, g, d]
        mask, score_mod = flex.flex_mask_at(self, grid, q.device, lambda: self.build_flex(grid, q.device))
        k_all, v_all = self.every_key(k, k_mem), self.every_key(v, v_mem)
        if kv_glob is None:
            return flex.run_flex(q, k_all, v_all, mask, score_mod, self.scale)
        P = self.num_prefix
        o_grid = flex.run_flex(q[:, :, P:], k_all, v_all, mask, score_mod, self.scale)  # [B, h, L, d]
        if not P:
            return o_grid
        k_rows, v_rows = self.every_key(kv_glob[0], kg_mem), self.every_key(kv_glob[1], vg_mem)
        o_pre = sdpa(q[:, :, :P], k_rows, v_rows, dropout_p=p_drop)  # prefix queries over every key: [B, h, P, d]
        return torch.cat([o_pre, o_grid], dim=2)

    def build_flex(self, grid: Grid, device: Any) -> tuple[Any, Any]:
        """``(BlockMask, score_mod or None)`` of the pattern at ``grid`` from :meth:`flex_grid_mod` /
        :meth:`flex_grid_bias`; with ``qkv_global`` the queries are the grid tokens only (see :meth:`attend_flex`)."""
        P, g, L = self.num_prefix, self.num_learned, grid[0] * grid[1]
        rows = P if self.qkv_global is None else 0  # query rows in front of the grid's
        mask_mod = flex.pattern_mask_mod(self.flex_grid_mod(grid, device), P, g, L, rows)
        bias = self.flex_grid_bias(grid, device)
        score_mod = None if bias is None else flex.pattern_score_mod(bias, P, g, L, rows)
        return flex.block_mask(mask_mod, self.num_heads, rows + L, P + g + L, device), score_mod

    def flex_grid_mod(self, grid: Grid, device: Any) -> flex.GridMod:  # pragma: no cover - abstract
        """``(head, grid query, grid key) -> bool`` from small tables on ``device`` (as :meth:`grid_mask`)."""
        raise NotImplementedError

    def flex_grid_bias(self, grid: Grid, device: Any) -> Optional[flex.GridMod]:
        """Additive score of a grid pair for the flex path (as :meth:`grid_bias`); None: no bias."""
        return None

    def gathered(self, q: Tensor, k_all: Tensor, v_all: Tensor, pat: SparsePattern, group: HeadGroup) -> Tensor:
        """Grid ``q[B, h, L, d]`` of one gathered head group over its keys in ``k_all, v_all[B, h, P + g + L, d]``
        -> ``[B, h, Q, S, d]``: each query group's S queries over its K keys, in fused calls."""
        p_drop = self.attn_drop.p if self.training else 0.0
        out = block_attention(
            q, k_all, v_all, pat.query_rows, group.keys, group.mask, self.scale, p_drop
        )  # [B, h, Q·S, d]
        return out.unflatten(2, pat.group_shape())

    def attend_flops(self, grid: Grid) -> int:
        """Analytic MACs of the pattern, for every ``attention.impl`` (FlexAttention skips fully masked
        blocks but computes partially masked ones densely, see :mod:`vitzoo.attention.sparse.flex`)."""
        pat = self.pattern_at(grid)
        P, g, d, C = self.num_prefix, self.num_learned, self.head_dim, self.dim
        n_keys = P + g + grid[0] * grid[1]
        n_glob = P + g + pat.num_global_grid
        Q, S = pat.group_shape()
        # learned global tokens: their queries g·C², the read (QKᵀ and AV of g queries over the
        # P + L tokens, 2g(P + L)C) and the keys and values of their states g·C·2C
        flops = g * C * C + sdpa_flops(1, self.num_heads, g, P + grid[0] * grid[1], d) + g * C * 2 * C
        # prefix and global-grid queries over every key: QKᵀ and AV, (P + G_grid)·n_keys·d per head each
        flops += sdpa_flops(1, self.num_heads, P + pat.num_global_grid, n_keys, d)
        for group in pat.groups:
            if isinstance(group, HaloGroup):
                # QKᵀ and AV of every query slot over its K halo keys plus the global keys, per head
                flops += halo_flops(group, n_glob, d)
            elif group.keys is None:
                # dense heads: every grid query over every key, QKᵀ and AV
                flops += sdpa_flops(1, group.heads, Q * S, n_keys, d)
            else:
                # QKᵀ and AV of Q·S queries over their K gathered keys (the global keys among them), per head
                flops += 2 * group.heads * Q * S * group.keys.shape[-1] * d
        return flops

    def halo_bias(self, group: HaloGroup, heads: slice) -> Optional[tuple[Tensor, Tensor]]:
        """Relative position bias of a halo group's heads: a table ``[heads, T]`` and the entry ``[blocks, S, K]``
        each halo score adds (:data:`vitzoo.ops.halo.RelBias`); None: no bias (overridden by ``local``)."""
        return None

    def grid_bias(self, grid: Grid) -> Optional[Tensor]:
        """Additive ``[h, L, L]`` grid-to-grid scores for :meth:`reference`; None: no bias."""
        return None

    def full_mask(self, grid: Grid) -> Tensor:
        """Boolean ``[h or 1, P + L, P + g + L]`` of the whole pattern (queries: real tokens only)."""
        P, g, L = self.num_prefix, self.num_learned, grid[0] * grid[1]
        inner = self.grid_mask(grid)  # [h or 1, L, L]
        mask = torch.ones(inner.shape[0], P + L, P + g + L, dtype=torch.bool)
        mask[:, P:, P + g :] = inner  # prefix rows and prefix/learned columns stay True: global
        return mask

    def reference(self, x: Tensor, grid: Grid) -> Tensor:
        """Dense masked ``softmax(QKᵀ/√d)V``; learned tokens first read every token densely, then their
        states are appended as ordinary keys/values (their own rows are not computed).

        With ``qkv_global`` every row is computed twice, densely: with ``qkv`` under the pattern's mask and with
        ``qkv_global`` over every key (the learned tokens' read too); the prefix rows take the second, the grid
        rows the first.
        """
        P, g, C = self.num_prefix, self.num_learned, self.dim
        q, k, v = self.split_heads(x)  # [B, h, P + L, d]
        glob = self.qkv_global
        q_g, k_g, v_g = (q, k, v) if glob is None else self.to_heads(glob(x), 3)
        if g:
            tokens = self.global_tokens.expand(x.shape[0], -1, -1)  # [B, g, C]
            q_t = (self.split_heads(tokens) if glob is None else self.to_heads(glob(tokens), 3))[0]  # [B, h, g, d]
            read = dense_attention(q_t, k_g, v_g)  # every token: [B, h, g, d]
            state = tokens + read.transpose(1, 2).reshape(x.shape[0], g, C)  # [B, g, C]
            _, k_t, v_t = self.split_heads(state)  # [B, h, g, d]
            k = torch.cat([k[:, :, :P], k_t, k[:, :, P:]], dim=2)  # [B, h, P + g + L, d]
            v = torch.cat([v[:, :, :P], v_t, v[:, :, P:]], dim=2)
            if glob is not None:
                _, k_t, v_t = self.to_heads(glob(state), 3)
                k_g = torch.cat([k_g[:, :, :P], k_t, k_g[:, :, P:]], dim=2)
                v_g = torch.cat([v_g[:, :, :P], v_t, v_g[:, :, P:]], dim=2)
        bias, inner = None, self.grid_bias(grid)
        if inner is not None:
            bias = inner.new_zeros(inner.shape[0], q.shape[2], k.shape[2])  # [h, P + L, P + g + L]
            bias[:, P:, P + g :] = inner
        out = dense_attention(q, k, v, allowed=self.full_mask(grid).to(x.device), bias=bias)
        if glob is not None:
            out = torch.cat([dense_attention(q_g, k_g, v_g)[:, :, :P], out[:, :, P:]], dim=2)  # prefix rows: global
        return self.merge_heads(out)

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        H, W = grid or self.grid
        return {**super().symbols(grid), "L": H * W, "P": self.num_prefix}


def block_count(grid: Grid, block: int) -> Grid:
    """Blocks per axis when the grid is padded to whole ``block``×``block`` blocks."""
    return tuple(math.ceil(s / block) for s in grid)
