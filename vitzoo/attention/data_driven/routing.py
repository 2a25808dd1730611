"""Routing attention: online k-means clusters of queries and keys, plus local heads.

Paper: Roy, Saffar, Vaswani and Grangier, "Efficient Content-Based Sparse Attention with Routing
Transformers", TACL 2021, https://arxiv.org/abs/2003.05997.

* Heads: the first ``local_heads`` heads are local, the others route (the paper pairs routing
  heads with local heads, so that every token attends to its neighbourhood whatever the routing).
* Pieces: every head cuts the M grid tokens into K pieces of w = ⌈M/K⌉ tokens, as token indices
  ``[B, h, K, w]`` of its queries and of its keys. Queries of a piece attend densely to the keys of
  that piece; all heads and pieces run in one gather and one batched matmul ([B, h, K, w, w] scores).
* Local heads: piece j is the window of w consecutive grid tokens (raster order) starting at
  ``⌊j·(M - w)/(K - 1)⌋``: the first starts at token 0 and the last ends at token M - 1. As K·w >= M
  the windows cover every token; they are disjoint when K divides M and otherwise overlap by
  K·w - M tokens in all. Fixed, data-independent and the same size as a cluster.
* Routing heads: K unit centroids ``mu[h_r, K, d]`` per routing head (a buffer, drawn at
  construction from a generator seeded by ``layer_index``). Queries and keys are unit-normalised
  and scored against every centroid; each centroid takes its top-w queries and its top-w keys, so
  every cluster has exactly w queries and w keys, as in the paper's balanced routing.
* A token in several pieces of a head merges their results by logsumexp (it attends to the
  multiset union of those key sets). In a routing head a token picked by no centroid attends only
  to the prefix keys, or gets a zero output there when there are none; its local heads still
  attend to its window.
* k-means update: in training, every forward assigns each normalised query and key of the routing
  heads to its nearest centroid and moves the centroid by an exponential moving average of the
  mean of its members (``mu <- normalise(decay·mu + (1 - decay)·mean)``), under ``no_grad``. Eval
  never changes them. The statistics (member sums and counts) are accumulated in float32 whatever
  the autocast dtype and summed over data-parallel ranks when ``torch.distributed`` is
  initialised, so every replica takes the same step.
* Cost: the centroid scores are 2MK·C_r (C_r = h_r·d channels of the routing heads) and the
  pieces of all heads 2Kw²C ≈ 2MwC; with the default K = ⌈√M⌉ both are O(M^1.5), the paper's
  complexity (so ``linear_cost`` is False). A local head costs what a routing head's clusters cost.
* Padding: nothing is padded. Windows and clusters hold w real tokens each, K·w >= M always;
  ``pad: false`` instead requires K to divide M exactly.
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
    dense_parts,
    gather_tokens,
    prefix_part,
    scatter_combine,
)


def all_ranks_sum(t: Tensor) -> Tensor:
    """``t`` summed over the data-parallel ranks when ``torch.distributed`` is initialised, else ``t``.

    Args:
        t: a float32 statistic of this rank's batch.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(t)  # in place, op=SUM
    return t


@dataclass
class RoutingConfig:
    num_clusters: Optional[int] = None  # pieces K per head (centroids or windows); null = ⌈√M⌉, M at construction
    local_heads: Optional[int] = None  # heads using K fixed windows instead of clusters, 1..h; null = ⌈h/2⌉
    decay: float = 0.999  # EMA decay of the centroid update in training, in (0, 1)
    pad: bool = True  # allow K not dividing M (pieces of ⌈M/K⌉ tokens); false = error when it does not divide

    def __post_init__(self):
        check_auto_size(self, "num_clusters")
        check_auto_size(self, "local_heads")
        check(isinstance(self.decay, (int, float)) and 0.0 < self.decay < 1.0,
              f"attention.decay must be in (0, 1) (got {self.decay!r})")


@register_attention("routing", RoutingConfig)
class RoutingAttention(BucketAttention):
    """Attention within fixed windows (local heads) and balanced k-means clusters (routing heads).

    Its cost is :attr:`formula` (C_r: channels of the routing heads).

    Args:
        cfg: :class:`RoutingConfig`.
        ctx: the host's context (``layer_index`` seeds the centroids).
    """

    formula = "4NC² + 2MK·C_r + 2Kw²C + 2PMC + 2PNC"

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

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        P = self.num_prefix
        (qp, qg), (kp, kg), (vp, vg) = self.split_prefix_qkv(q, k, v)
        idx_q, idx_k = self.pieces(qg, kg, self.cluster_size(grid), update=self.training)  # [B, h, K, w] each
        qc = gather_tokens(qg, idx_q)  # [B, h, K, w, d]
        kc, vc = gather_tokens(torch.cat([kg, vg], -1), idx_k).chunk(2, dim=-1)  # [B, h, K, w, d] each, one gather
        out, lse = attend_pieces(qc, kc, vc, self.scale, drop=self.attn_drop)  # [B, h, K, w, d], [B, h, K, w]
        extra = prefix_part(qg, kp, vp, self.scale, self.attn_drop) if P else None
        out_g = scatter_combine(out, lse, idx_q, qg.shape[-2], extra)  # [B, h, M, d]
        return self.prefix_rows(qp, k, v, out_g)

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        """Dense: key j counts for query i once per window, or per cluster, holding i as a query and j as a key."""
        P, hl = self.num_prefix, self.local_heads
        (qp, qg), (kp, kg), (vp, vg) = self.split_prefix_qkv(q, k, v)
        B, _, m, _ = qg.shape
        w = self.cluster_size(grid)
        starts = torch.tensor(
            [j * (m - w) // max(self.num_clusters - 1, 1) for j in range(self.num_clusters)], device=q.device
        )
        pos = torch.arange(m, device=q.device).unsqueeze(-1)  # [M, 1]
        inside = ((pos >= starts) & (pos < starts + w)).to(q.dtype)  # [M, K] token in window j
        local = (inside @ inside.T).expand(B, hl, m, m)  # [B, h_l, M, M] windows shared by i and j
        idx_q, idx_k = self.route(qg[:, hl:], kg[:, hl:], w)
        member_q = F.one_hot(idx_q, m).sum(-2).transpose(-2, -1).to(q.dtype)  # [B, h_r, M, K]
        member_k = F.one_hot(idx_k, m).sum(-2).transpose(-2, -1).to(q.dtype)  # [B, h_r, M, K]
        count = torch.cat([local, member_q @ member_k.transpose(-2, -1)], 1)  # [B, h, M, M] pieces shared by i, j
        count = torch.cat([count, count.new_ones(*count.shape[:-1], P)], dim=-1)  # prefix keys once
        scores = (qg @ torch.cat([kg, kp], 2).transpose(-2, -1)) * self.scale  # [B, h, M, M + P]
        out = dense_parts(scores, count, torch.cat([vg, vp], 2))
        return self.dense_prefix_rows(qp, k, v, out)

    def attend_flops(self, grid: Grid) -> int:
        m, d, h, K = grid[0] * grid[1], self.head_dim, self.num_heads, self.num_clusters
        w = self.cluster_size(grid)
        # centroid scores of the routing heads' queries and keys: [q̂; k̂] @ mu, 2M·d·K per routing head
        flops = 2 * (h - self.local_heads) * m * d * K
        # per window or cluster, every head: q kᵀ (w·w·d) and attn v (w·w·d)
        flops += h * attend_pieces_flops(K, w, w, d)
        return flops + self.prefix_flops(grid)  # prefix keys of the grid queries, prefix queries

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        grid = grid or self.grid
        return {
            **super().symbols(grid),
            "K": self.num_clusters,
            "w": self.cluster_size(grid),
            "C_r": (self.num_heads - self.local_heads) * self.head_dim,
            "P": self.num_prefix,
            "M": grid[0] * grid[1],
        }
