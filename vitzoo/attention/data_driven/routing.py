"""Routing attention: online k-means clusters of queries and keys, plus local heads.

Paper: Roy, Saffar, Vaswani and Grangier, "Efficient Content-Based Sparse Attention with Routing
Transformers", TACL 2021, https://arxiv.org/abs/2003.05997.

* Heads: the first ``local_heads`` heads are local, the others route (the paper pairs routing
  heads with local heads, so that every token attends to its neighbourhood whatever the routing).
* Pieces (local heads; every head with ``assignment: balanced``): a head cuts the M grid tokens into K pieces
  of w = ⌈M/K⌉ tokens, as token indices ``[B, h, K, w]`` of its queries and of its keys. Queries of a piece
  attend densely to the keys of that piece; all such heads and pieces run in one gather and one batched
  matmul ([B, h, K, w, w] scores). The cluster size w also sets the routing heads' blocks (below).
* Local heads: piece j is the window of w consecutive grid tokens (raster order) starting at
  ``⌊j·(M - w)/(K - 1)⌋``: the first starts at token 0 and the last ends at token M - 1. As K·w >= M
  the windows cover every token; they are disjoint when K divides M and otherwise overlap by
  K·w - M tokens in all. Fixed, data-independent and the same size as a cluster.
* Routing heads (``assignment: nearest``, the paper's): K unit centroids ``mu[h_r, K, d]`` per routing
  head (a buffer, drawn at construction from a generator seeded by ``layer_index``). Every unit-normalised
  query and key goes to its nearest centroid, and a query attends to the keys of its own cluster (Eq. 7 of
  the paper: ``X'_i = Σ_{j: K_j ∈ μ(Q_i)} A_ij V_j``) and to the prefix keys. No token is left out; a query
  whose cluster holds no key attends to its own key as well (the one deliberate addition: no empty row).
* Cluster-sorted blocks (how the routing heads run): per image and routing head the queries and the keys are
  sorted by cluster (ties in token order). The sorted queries are cut into nb = ⌈M/w⌉ blocks of w slots (the
  last block repeats the last sorted query; that copy counts 0). The keys of a block's clusters are one run of
  the sorted keys, [lo, hi): from the first key of its smallest cluster to the last key of its largest. Each
  block gathers the S·w sorted keys from lo, S = ⌈max(hi - lo)/w⌉ over the batch, heads and blocks (the span),
  scores them (``[B, h_r, nb, w, S·w]``) with a large finite negative bias on keys of another cluster and past
  hi (a row whose cluster holds no key then gets a negligible log-normaliser), and merges by logsumexp with
  the prefix part and the own-key part (``q_i·k_i``, counted only where the cluster holds no key). Exact
  whatever the clusters' sizes. Balanced clusters (w keys each) give S <= 2 (a block of w sorted queries spans
  at most two clusters), so O(M^1.5) like the paper; one cluster holding most keys gives S -> nb: quadratic.
* The span: in eager mode S is read from the data (one host sync per forward; a FLOP count's trace does the
  same). Under ``torch.compile``/``torch.export``, ONNX export and ``torch.jit`` traces
  (:func:`~vitzoo.attention.functional.fixed_sizes`) S = nb: every block scores every key, exact with fixed
  shapes and no host sync, at the cost of dense attention (2M²C_r for M a multiple of w). :meth:`flops` and
  :meth:`symbols` use the S of the last forward at that grid (``spans``, not saved): the data's after an eager
  forward, nb after a compiled one (dynamo replays the graph's write to ``spans`` on every call, so a compiled
  model reports the dense cost its graph runs) or a ``torch.jit`` trace (ONNX, TorchScript); min(2, nb) before
  any forward. ``torch.export`` puts the module's attributes back after tracing: its program runs S = nb and
  leaves ``spans`` as it was.
* ``assignment: balanced``, an option: each centroid takes its top-w queries and its top-w keys (clusters of
  exactly w, O(M^1.5)), as the paper's released code does; a token picked by no centroid attends only to
  the prefix keys in that head (or gets 0 there without any), and a token in several clusters merges them.
* A token in several pieces of a local head merges their results by logsumexp (it attends to the
  multiset union of those key sets).
* k-means update: in training, every forward assigns each normalised query and key of the routing
  heads to its nearest centroid and moves the centroid by an exponential moving average of the
  mean of its members (``mu <- normalise(decay·mu + (1 - decay)·mean)``), under ``no_grad``. Eval
  never changes them. The statistics (member sums and counts) are accumulated in float32 whatever
  the autocast dtype and summed over data-parallel ranks when ``torch.distributed`` is
  initialised, so every replica takes the same step.
* Cost: the centroid scores are 2MK·C_r (C_r = h_r·d channels of the routing heads), the local heads'
  windows 2Kw²C_l ≈ 2MwC_l (O(M^1.5) with the default K = ⌈√M⌉), the routing heads' blocks
  2⌈M/w⌉w·Sw·C_r and own-key scores MC_r (``balanced``: 2Kw²C_r), so ``linear_cost`` is False.
* Padding: no token is padded. Windows and clusters hold w real tokens each, K·w >= M always (the routing
  heads' last block repeats a real query); ``pad: false`` instead requires K to divide M exactly.
* Prefix tokens (class token): every grid query also attends to the P prefix keys (merged by
  logsumexp) and every prefix query attends to all N keys: O(P·N) extra.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, check
from vitzoo.attention.data_driven.bucket import (
    BucketAttention,
    attend_pieces,
    attend_pieces_flops,
    auto_size,
    check_auto_size,
    combine_parts,
    dense_parts,
    gather_tokens,
    prefix_part,
    scatter_combine,
)
from vitzoo.attention.data_driven.routing_memory import routing_memory
from vitzoo.attention.data_driven.routing_reference import naive_nearest, routed_reference
from vitzoo.attention.functional import fixed_sizes
from vitzoo.costs import Saved


def all_ranks_sum(t: Tensor) -> Tensor:
    """``t`` summed over the data-parallel ranks when ``torch.distributed`` is initialised, else ``t``.

    Args:
        t: a float32 statistic of this rank's batch.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(t)  # in place, op=SUM
    return t


ASSIGNMENTS = ("nearest", "balanced")  # attention.assignment


@dataclass
class RoutingConfig:
    num_clusters: Optional[int] = None  # pieces K per head (centroids or windows); null = ⌈√M⌉, M at construction
    local_heads: Optional[int] = None  # heads using K fixed windows instead of clusters, 1..h; null = ⌈h/2⌉
    decay: float = 0.999  # EMA decay of the centroid update in training, in (0, 1)
    pad: bool = True  # allow K not dividing M (pieces of ⌈M/K⌉ tokens); false = error when it does not divide
    assignment: str = "nearest"  # nearest: every query and key to its nearest centroid (the paper); balanced: top-w

    def __post_init__(self):
        check_auto_size(self, "num_clusters")
        check_auto_size(self, "local_heads")
        check(self.assignment in ASSIGNMENTS,
              f"attention.assignment must be one of {', '.join(ASSIGNMENTS)} (got {self.assignment!r})")
        check(isinstance(self.decay, (int, float)) and 0.0 < self.decay < 1.0,
              f"attention.decay must be in (0, 1) (got {self.decay!r})")


@register_attention("routing", RoutingConfig)
class RoutingAttention(BucketAttention):
    """Attention within fixed windows (local heads) and online k-means clusters (routing heads).

    Its cost is :attr:`formula` (C_r, C_l: channels of the routing and of the local heads; S: the span).

    Args:
        cfg: :class:`RoutingConfig`.
        ctx: the host's context (``layer_index`` seeds the centroids).
    """

    formula = "4NC² + 2MK·C_r + 2Kw²C_l + 2⌈M/w⌉w·Sw·C_r + MC_r + 2PMC + 2PNC"

    def __init__(self, cfg: RoutingConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        self.num_clusters = auto_size(cfg.num_clusters, ctx.grid)
        self.local_heads = math.ceil(self.num_heads / 2) if cfg.local_heads is None else cfg.local_heads
        check(self.local_heads <= self.num_heads,
              f"attention.local_heads={self.local_heads} is more than the {self.num_heads} heads (model.num_heads)")
        self.cluster_size(ctx.grid)
        g = torch.Generator().manual_seed(ctx.layer_index)
        shape = (self.num_heads - self.local_heads, self.num_clusters, self.head_dim)
        self.register_buffer("centroids", F.normalize(torch.randn(*shape, generator=g), dim=-1))  # [h_r, K, d] unit
        # grid -> span S of the last forward there; the built grid's key from the start: a compiled forward adds none
        self.spans: dict[Grid, int] = {tuple(ctx.grid): self.default_span(ctx.grid)}

    def cluster_size(self, grid: Grid) -> int:
        """Tokens w per piece at ``grid`` (ConfigError when K is out of range or does not divide with pad off)."""
        m = self.check_pieces("num_clusters", self.num_clusters, grid)
        return math.ceil(m / self.num_clusters)

    def windows(self, m: int, w: int, device: torch.device) -> Tensor:
        """Token indices ``[K, w]`` of the local heads' windows: window j starts at ``⌊j·(M - w)/(K - 1)⌋``.

        Args:
            m: grid tokens M.
            w: window size (the cluster size).
            device: device of the indices.
        """
        K = self.num_clusters
        starts = torch.arange(K, device=device) * (m - w) // max(K - 1, 1)  # [K]
        return starts.unsqueeze(-1) + torch.arange(w, device=device)  # [K, w]

    def pieces(self, q: Tensor, k: Tensor, w: int, update: bool = False) -> tuple[Tensor, Tensor]:
        """Token indices ``[B, h, K, w]`` of the queries and of the keys of every piece of every head.

        Args:
            q, k: grid queries and keys ``[B, h, M, d]``.
            w: piece size.
            update: take an EMA k-means step on the centroids afterwards (training).
        """
        B, _, m, _ = q.shape
        hl = self.local_heads
        local = self.windows(m, w, q.device).expand(B, hl, -1, -1)  # [B, h_l, K, w]
        idx_q, idx_k = self.route(q[:, hl:], k[:, hl:], w, update)  # [B, h_r, K, w] each
        return torch.cat([local, idx_q], 1), torch.cat([local, idx_k], 1)

    def route(self, q: Tensor, k: Tensor, w: int, update: bool = False) -> tuple[Tensor, Tensor]:
        """Token indices ``[B, h_r, K, w]`` of the queries and of the keys of every cluster.

        Args:
            q, k: grid queries and keys of the routing heads ``[B, h_r, M, d]``.
            w: cluster size.
            update: take an EMA k-means step on the centroids afterwards (training).
        """
        with torch.no_grad():  # a decision (top-w indices): autograd keeps nothing of it
            x = F.normalize(torch.cat([q, k], 2), dim=-1)  # [B, h_r, 2M, d] queries then keys
            aff = x @ self.centroids.transpose(-2, -1)  # [B, h_r, 2M, K]: one matmul for queries and keys
        if update:
            self.update_centroids(x, aff)
        aff_q, aff_k = aff.chunk(2, dim=-2)  # [B, h_r, M, K] each
        idx_q = aff_q.topk(w, dim=-2).indices.transpose(-2, -1)  # [B, h_r, K, w]
        idx_k = aff_k.topk(w, dim=-2).indices.transpose(-2, -1)  # [B, h_r, K, w]
        return idx_q, idx_k

    @torch.no_grad()
    def update_centroids(self, x: Tensor, aff: Tensor) -> None:
        """EMA k-means step: ``x[B, h_r, T, d]`` unit vectors, ``aff[B, h_r, T, K]`` their centroid scores."""
        B, h, _, d = x.shape
        assign = aff.argmax(dim=-1)  # [B, h_r, T] nearest centroid
        # sums of up to B·T members in the buffer's dtype (float32), not the autocast one
        x = x.to(self.centroids.dtype)
        sums = x.new_zeros(B, h, self.num_clusters, d).scatter_add(2, assign.unsqueeze(-1).expand(-1, -1, -1, d), x)
        counts = x.new_zeros(B, h, self.num_clusters).scatter_add(2, assign, torch.ones_like(assign, dtype=x.dtype))
        sums, counts = sums.sum(0), counts.sum(0).unsqueeze(-1)  # [h_r, K, d], [h_r, K, 1]
        sums, counts = all_ranks_sum(sums), all_ranks_sum(counts)
        mean = sums / counts.clamp_min(1)
        moved = F.normalize(self.cfg.decay * self.centroids + (1 - self.cfg.decay) * mean, dim=-1)
        self.centroids.copy_(torch.where(counts > 0, moved, self.centroids))

    def nearest(self, q: Tensor, k: Tensor, update: bool = False) -> tuple[Tensor, Tensor]:
        """The nearest centroid ``[B, h_r, M]`` of every query and of every key of the routing heads.

        Args:
            q, k: grid queries and keys of the routing heads ``[B, h_r, M, d]``.
            update: take an EMA k-means step on the centroids afterwards (training).
        """
        with torch.no_grad():  # a decision (argmax): autograd keeps nothing of it
            x = F.normalize(torch.cat([q, k], 2), dim=-1)  # [B, h_r, 2M, d] queries then keys
            aff = x @ self.centroids.transpose(-2, -1)  # [B, h_r, 2M, K]
        if update:
            self.update_centroids(x, aff)
        return aff.argmax(dim=-1).chunk(2, dim=-1)  # [B, h_r, M] each (NaN scores pick a cluster, stay NaN)

    def routed(self, q: Tensor, k: Tensor, v: Tensor, kp: Tensor, vp: Tensor, w: int, grid: Grid,
               update: bool) -> Tensor:
        """Routing heads through cluster-sorted blocks (module docstring): each grid query attends to the grid keys
        of its cluster (its own key where the cluster holds none) and to the prefix keys ``[B, h_r, M, d]``.

        Args:
            q, k, v: the routing heads' grid queries, keys, values ``[B, h_r, M, d]``.
            kp, vp: their prefix keys and values ``[B, h_r, P, d]``.
            w: block size (the cluster size).
            grid: the token grid (the span S is kept per grid for :meth:`attend_flops`).
            update: take an EMA k-means step (training).
        """
        c_q, c_k = self.nearest(q, k, update)  # [B, h_r, M] each
        m, nb = q.shape[2], math.ceil(q.shape[2] / w)
        tie = torch.arange(m, device=q.device)  # keys c·M + token are unique: a stable order (ONNX: no stable sort)
        order_q, order_k = (c_q * m + tie).argsort(dim=-1), (c_k * m + tie).argsort(dim=-1)  # [B, h_r, M] each
        counts = c_k.new_zeros(*c_k.shape[:2], self.num_clusters).scatter_add(2, c_k, torch.ones_like(c_k))
        ends = counts.cumsum(-1)  # [B, h_r, K] keys per cluster (counts), past the last sorted key of each (ends)
        slots = torch.arange(nb * w, device=q.device)  # [nb·w]: query slot -> sorted position (the last one repeated)
        tok_q = order_q.gather(2, slots.clamp_max(m - 1).expand(*c_q.shape[:2], -1))  # [B, h_r, nb·w] token per slot
        clu_q = c_q.gather(2, tok_q).unflatten(2, (nb, w))  # [B, h_r, nb, w] its cluster, ascending in a block
        lo = (ends - counts).gather(2, clu_q[..., 0])  # [B, h_r, nb] first key of the block's smallest cluster
        hi = ends.gather(2, clu_q[..., -1])  # [B, h_r, nb] past the last key of its largest
        span = nb if fixed_sizes() else max(1, math.ceil(int((hi - lo).amax()) / w))  # one host sync
        # the S this forward computes, compiled graphs included (dynamo replays the write after every call; the
        # dict is only written here, never read in forward, so it adds no guard on its values)
        self.spans[(int(grid[0]), int(grid[1]))] = span  # ints: a traced grid may hold 0-dim tensors
        pos = lo.unsqueeze(-1) + torch.arange(span * w, device=q.device)  # [B, h_r, nb, S·w] sorted key positions
        tok_k = order_k.gather(2, pos.clamp_max(m - 1).flatten(2))  # [B, h_r, nb·S·w] token per key slot
        clu_k = c_k.gather(2, tok_k).unflatten(2, (nb, span * w))  # [B, h_r, nb, S·w] its cluster
        allowed = (pos < hi.unsqueeze(-1)).unsqueeze(-2) & (clu_k.unsqueeze(-2) == clu_q.unsqueeze(-1))
        bias = torch.where(allowed, q.new_zeros(()), q.new_full((), -torch.finfo(q.dtype).max / 16))  # [.., w, S·w]
        kc, vc = gather_tokens(torch.cat([k, v], -1), tok_k.unflatten(2, (nb, -1))).chunk(2, -1)  # [B, h_r, nb, S·w, d]
        tok_q = tok_q.unflatten(2, (nb, w))  # [B, h_r, nb, w]
        out, lse = attend_pieces(gather_tokens(q, tok_q), kc, vc, self.scale, bias, self.attn_drop)  # [B, h_r, nb, w]
        lse = lse.masked_fill((slots >= m).view(nb, w), float("-inf"))  # the repeated query slots count 0
        own = ((q * self.scale).unsqueeze(-2) @ k.unsqueeze(-1)).flatten(2)  # [B, h_r, M, 1, 1] -> [B, h_r, M]
        own = own.masked_fill(counts.gather(2, c_q) > 0, float("-inf"))  # only where the query's cluster has no key
        extra = (v, own)
        if self.num_prefix:
            out_p, lse_p = prefix_part(q, kp, vp, self.scale, self.attn_drop)  # [B, h_r, M, d], [B, h_r, M]
            lses = torch.stack([lse_p, own], 2)  # [B, h_r, 2, M]
            extra = (combine_parts(torch.stack([out_p, v], 2), lses, 2), lses.logsumexp(2))
        return scatter_combine(out, lse, tok_q, m, extra)  # [B, h_r, M, d]

    def span(self, grid: Grid) -> int:
        """Key blocks S per query block of the routing heads: the last forward's at ``grid``, else the default."""
        return self.spans.get((int(grid[0]), int(grid[1])), self.default_span(grid))

    def default_span(self, grid: Grid) -> int:
        """min(2, nb): the span of balanced clusters, reported before any forward at ``grid``."""
        return min(2, math.ceil(grid[0] * grid[1] / self.cluster_size(grid)))

    def local(self, q: Tensor, k: Tensor, v: Tensor, kp: Tensor, vp: Tensor, w: int) -> Tensor:
        """Local heads: each grid query attends to its window(s) and the prefix keys ``[B, h_l, M, d]``.

        Args:
            q, k, v: the local heads' grid queries, keys, values ``[B, h_l, M, d]``.
            kp, vp: their prefix keys and values ``[B, h_l, P, d]``.
            w: window size.
        """
        B, h, m, _ = q.shape
        idx = self.windows(m, w, q.device).expand(B, h, -1, -1)  # [B, h_l, K, w]
        kc, vc = gather_tokens(torch.cat([k, v], -1), idx).chunk(2, dim=-1)  # [B, h_l, K, w, d] each
        out, lse = attend_pieces(gather_tokens(q, idx), kc, vc, self.scale, drop=self.attn_drop)
        extra = prefix_part(q, kp, vp, self.scale, self.attn_drop) if self.num_prefix else None
        return scatter_combine(out, lse, idx, m, extra)  # [B, h_l, M, d]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        (qp, qg), (kp, kg), (vp, vg) = self.split_prefix_qkv(q, k, v)
        w, hl = self.cluster_size(grid), self.local_heads
        if self.cfg.assignment == "balanced":
            return self.prefix_rows(qp, k, v, self.balanced(qg, kg, vg, kp, vp, w))
        parts = [self.local(qg[:, :hl], kg[:, :hl], vg[:, :hl], kp[:, :hl], vp[:, :hl], w)]
        if hl < self.num_heads:
            parts.append(self.routed(qg[:, hl:], kg[:, hl:], vg[:, hl:], kp[:, hl:], vp[:, hl:], w, grid,
                                     self.training))
        return self.prefix_rows(qp, k, v, torch.cat(parts, 1))  # [B, h, N, d]

    def balanced(self, qg: Tensor, kg: Tensor, vg: Tensor, kp: Tensor, vp: Tensor, w: int) -> Tensor:
        """``assignment: balanced``: every head through pieces of w tokens (windows, top-w clusters) ``[B, h, M, d]``.

        Args:
            qg, kg, vg: grid queries, keys, values ``[B, h, M, d]``; kp, vp: prefix keys, values ``[B, h, P, d]``.
            w: piece size.
        """
        idx_q, idx_k = self.pieces(qg, kg, w, update=self.training)  # [B, h, K, w] each
        qc = gather_tokens(qg, idx_q)  # [B, h, K, w, d]
        kc, vc = gather_tokens(torch.cat([kg, vg], -1), idx_k).chunk(2, dim=-1)  # [B, h, K, w, d] each, one gather
        out, lse = attend_pieces(qc, kc, vc, self.scale, drop=self.attn_drop)  # [B, h, K, w, d], [B, h, K, w]
        extra = prefix_part(qg, kp, vp, self.scale, self.attn_drop) if self.num_prefix else None
        return scatter_combine(out, lse, idx_q, qg.shape[-2], extra)  # [B, h, M, d]

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        """Dense: key j counts for query i once per window (local heads) and, in a routing head, when both went
        to the same centroid (:func:`naive_nearest`, :func:`routed_reference`); ``balanced`` counts the
        clusters holding i as a query and j as a key."""
        P, hl = self.num_prefix, self.local_heads
        (qp, qg), (kp, kg), (vp, vg) = self.split_prefix_qkv(q, k, v)
        B, _, m, _ = qg.shape
        w = self.cluster_size(grid)
        starts = torch.tensor(
            [j * (m - w) // max(self.num_clusters - 1, 1) for j in range(self.num_clusters)], device=q.device
        )
        pos = torch.arange(m, device=q.device).unsqueeze(-1)  # [M, 1]
        inside = ((pos >= starts) & (pos < starts + w)).to(q.dtype)  # [M, K] token in window j
        count = (inside @ inside.T).expand(B, hl, m, m)  # [B, h_l, M, M] windows shared by i and j
        if self.cfg.assignment == "balanced":
            idx_q, idx_k = self.route(qg[:, hl:], kg[:, hl:], w)
            member_q = F.one_hot(idx_q, m).sum(-2).transpose(-2, -1).to(q.dtype)  # [B, h_r, M, K]
            member_k = F.one_hot(idx_k, m).sum(-2).transpose(-2, -1).to(q.dtype)  # [B, h_r, M, K]
            count = torch.cat([count, member_q @ member_k.transpose(-2, -1)], 1)  # [B, h, M, M]
        heads = count.shape[1]
        count = torch.cat([count, count.new_ones(*count.shape[:-1], P)], dim=-1)  # prefix keys once
        scores = (qg[:, :heads] @ torch.cat([kg, kp], 2)[:, :heads].transpose(-2, -1)) * self.scale  # [B, h', M, M+P]
        out = dense_parts(scores, count, torch.cat([vg, vp], 2)[:, :heads])
        if heads < self.num_heads:  # nearest: the routing heads from the naive decision
            c_q = naive_nearest(qg[:, hl:], self.centroids)
            c_k = naive_nearest(kg[:, hl:], self.centroids)
            out = torch.cat([out, routed_reference(qg[:, hl:], kg[:, hl:], vg[:, hl:], kp[:, hl:], vp[:, hl:],
                                                   c_q, c_k)], 1)
        return self.dense_prefix_rows(qp, k, v, out)

    def attend_memory(self, grid: Grid, batch: int, amp: Optional[torch.dtype],
                      span: Optional[int] = None) -> list[Saved]:
        """:func:`~vitzoo.attention.data_driven.routing_memory.routing_memory`.

        Args:
            grid: token grid; batch: images; amp: autocast dtype or ``None``.
            span: the routing heads' span S; default: the last forward's at ``grid`` (:meth:`span`).
        """
        return routing_memory(self, grid, batch, amp, self.span(grid) if span is None else span)

    def memory(self, grid: Optional[Grid] = None, batch: int = 1, amp: Optional[torch.dtype] = None,
               input_dtype: Optional[torch.dtype] = None, span: Optional[int] = None) -> list[Saved]:
        """:meth:`QKVAttention.memory` with the span S of the routing heads (default: the last forward's)."""
        grid = grid or self.grid
        return (self.projection_memory(self.seq_len(grid), batch, amp, input_dtype)
                + self.attend_memory(grid, batch, amp, span))

    def attend_flops(self, grid: Grid) -> int:
        m, d, h, K, P = grid[0] * grid[1], self.head_dim, self.num_heads, self.num_clusters, self.num_prefix
        w, h_r = self.cluster_size(grid), self.num_heads - self.local_heads
        # centroid scores of the routing heads' queries and keys: [q̂; k̂] @ mu, 2M·d·K per routing head
        flops = 2 * h_r * m * d * K + h * attend_pieces_flops(1, P, P + m, d)  # ... and the prefix queries
        if self.cfg.assignment == "balanced":  # every head: K pieces of w queries and w keys, plus prefix keys
            return flops + h * (attend_pieces_flops(K, w, w, d) + attend_pieces_flops(1, m, P, d))
        # local heads' windows; every head's grid queries against the prefix keys
        flops += self.local_heads * attend_pieces_flops(K, w, w, d) + h * attend_pieces_flops(1, m, P, d)
        # routing heads: nb blocks of w queries against S·w keys (q kᵀ and attn v), and q_i·k_i (d) per query
        return flops + h_r * (attend_pieces_flops(math.ceil(m / w), w, self.span(grid) * w, d) + m * d)

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        grid = grid or self.grid
        return {
            **super().symbols(grid),
            "K": self.num_clusters,
            "w": self.cluster_size(grid),
            "C_r": (self.num_heads - self.local_heads) * self.head_dim,
            "C_l": self.local_heads * self.head_dim,
            "P": self.num_prefix,
            "M": grid[0] * grid[1],
            "S": self.span(grid),
        }
