"""Routing attention: online k-means clusters of queries and keys.

Paper: Roy, Saffar, Vaswani and Grangier, "Efficient Content-Based Sparse Attention with Routing
Transformers", TACL 2021, https://arxiv.org/abs/2003.05997.

* Routing: per head, K unit centroids ``mu[h, K, d]`` (a buffer, drawn at construction from a
  generator seeded by ``layer_index``). Queries and keys are unit-normalised and scored against
  every centroid; each centroid takes its top-w queries and its top-w keys (w = ⌈M/K⌉ for M grid
  tokens), so every cluster has exactly w queries and w keys, as in the paper's balanced routing.
  The queries of a cluster attend densely to the keys of that cluster ([B, h, K, w, w] scores).
* A token picked by several centroids merges its cluster results by logsumexp (it attends to the
  multiset union of those key sets); a token picked by none attends only to the prefix keys, or
  gets a zero attention output when there are none (the residual carries it).
* k-means update: in training, every forward assigns each normalised query and key to its nearest
  centroid and moves the centroid by an exponential moving average of the mean of its members
  (``mu <- normalise(decay·mu + (1 - decay)·mean)``), under ``no_grad``: centroids are updated, not
  back-propagated. Eval never changes them. The statistics (member sums and counts) are
  accumulated in float32 whatever the autocast dtype and summed over data-parallel ranks when
  ``torch.distributed`` is initialised, so every replica takes the same step.
* Cost: the centroid scores are 2MKC and the clusters 2Kw²C ≈ 2MwC; with the default K = ⌈√M⌉
  both are O(M^1.5), the paper's complexity (so ``linear_cost`` is False).
* Padding: nothing is padded. Clusters are chosen by top-w over the M real tokens, so K·w >= M
  always; ``pad: false`` instead requires K to divide M exactly.
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
from vitzoo.attention._buckets import (DataDrivenAttention, attend_pieces, attend_pieces_flops, auto_size, check_auto_size,
                                       dense_parts, gather_tokens, prefix_part, scatter_combine)
from vitzoo.attention.base import Grid, MixerContext, check


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
    num_clusters: Optional[int] = None  # centroids K per head; null = ⌈√M⌉ for M grid tokens at construction
    decay: float = 0.999  # EMA decay of the centroid update in training, in (0, 1)
    pad: bool = True  # allow K not dividing M (cluster size ⌈M/K⌉); false = error when it does not divide

    def __post_init__(self):
        check_auto_size(self, "num_clusters")
        check(isinstance(self.decay, (int, float)) and 0.0 < self.decay < 1.0,
              f"attention.decay must be in (0, 1) (got {self.decay!r})")


@register_attention("routing", RoutingConfig)
class RoutingAttention(DataDrivenAttention):
    """Attention within balanced k-means clusters; its cost is :attr:`formula`.

    Args:
        cfg: :class:`RoutingConfig`.
        ctx: the host's context (``layer_index`` seeds the centroids).
    """

    formula = "4NC² + 2MKC + 2Kw²C + 2PMC + 2PNC"

    def __init__(self, cfg: RoutingConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        self.num_clusters = auto_size(cfg.num_clusters, ctx.grid)
        self.cluster_size(ctx.grid)
        g = torch.Generator().manual_seed(ctx.layer_index)
        mu = F.normalize(torch.randn(self.num_heads, self.num_clusters, self.head_dim, generator=g), dim=-1)
        self.register_buffer("centroids", mu)  # [h, K, d] unit vectors

    def cluster_size(self, grid: Grid) -> int:
        """Tokens w per cluster at ``grid`` (ConfigError when K is out of range or does not divide with pad off)."""
        m = self.check_pieces("num_clusters", self.num_clusters, grid)
        return math.ceil(m / self.num_clusters)

    def route(self, q: Tensor, k: Tensor, w: int, update: bool = False) -> tuple[Tensor, Tensor]:
        """Token indices ``[B, h, K, w]`` of the queries and of the keys of every cluster.

        Args:
            q, k: grid queries and keys ``[B, h, M, d]``.
            w: cluster size.
            update: take an EMA k-means step on the centroids afterwards (training).
        """
        qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        mu = self.centroids.transpose(-2, -1)  # [h, d, K]
        aff_q, aff_k = qn @ mu, kn @ mu  # [B, h, M, K] each
        if update:
            self.update_centroids(torch.cat([qn, kn], 2), torch.cat([aff_q, aff_k], 2))
        idx_q = aff_q.topk(w, dim=-2).indices.transpose(-2, -1)  # [B, h, K, w]
        idx_k = aff_k.topk(w, dim=-2).indices.transpose(-2, -1)  # [B, h, K, w]
        return idx_q, idx_k

    @torch.no_grad()
    def update_centroids(self, x: Tensor, aff: Tensor) -> None:
        """EMA k-means step: ``x[B, h, T, d]`` unit vectors, ``aff[B, h, T, K]`` their centroid scores."""
        B, h, _, d = x.shape
        assign = aff.argmax(dim=-1)  # [B, h, T] nearest centroid
        x = x.to(self.centroids.dtype)  # sums of up to B·T members in the buffer's dtype (float32), not the autocast one
        sums = x.new_zeros(B, h, self.num_clusters, d).scatter_add(2, assign.unsqueeze(-1).expand(-1, -1, -1, d), x)
        counts = x.new_zeros(B, h, self.num_clusters).scatter_add(2, assign, torch.ones_like(assign, dtype=x.dtype))
        sums, counts = sums.sum(0), counts.sum(0).unsqueeze(-1)  # [h, K, d], [h, K, 1]
        sums, counts = all_ranks_sum(sums), all_ranks_sum(counts)
        mean = sums / counts.clamp_min(1)
        moved = F.normalize(self.cfg.decay * self.centroids + (1 - self.cfg.decay) * mean, dim=-1)
        self.centroids.copy_(torch.where(counts > 0, moved, self.centroids))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        P = self.num_prefix
        (qp, qg), (kp, kg), (vp, vg) = self.split_prefix_qkv(q, k, v)
        idx_q, idx_k = self.route(qg, kg, self.cluster_size(grid), update=self.training)
        qc = gather_tokens(qg, idx_q)  # [B, h, K, w, d]
        kc, vc = gather_tokens(kg, idx_k), gather_tokens(vg, idx_k)  # [B, h, K, w, d]
        out, lse = attend_pieces(qc, kc, vc, self.scale, drop=self.attn_drop)  # [B, h, K, w, d], [B, h, K, w]
        extra = prefix_part(qg, kp, vp, self.scale, self.attn_drop) if P else None
        out_g = scatter_combine(out, lse, idx_q, qg.shape[-2], extra)  # [B, h, M, d]
        return self.prefix_rows(qp, k, v, out_g)

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        """Dense: key j counts for query i once per cluster holding i as a query and j as a key."""
        P = self.num_prefix
        (qp, qg), (kp, kg), (vp, vg) = self.split_prefix_qkv(q, k, v)
        m = qg.shape[-2]
        idx_q, idx_k = self.route(qg, kg, self.cluster_size(grid))
        member_q = F.one_hot(idx_q, m).sum(-2).transpose(-2, -1).to(q.dtype)  # [B, h, M, K]
        member_k = F.one_hot(idx_k, m).sum(-2).transpose(-2, -1).to(q.dtype)  # [B, h, M, K]
        count = member_q @ member_k.transpose(-2, -1)  # [B, h, M, M] clusters shared by query i and key j
        count = torch.cat([count, count.new_ones(*count.shape[:-1], P)], dim=-1)  # prefix keys once
        scores = (qg @ torch.cat([kg, kp], 2).transpose(-2, -1)) * self.scale  # [B, h, M, M + P]
        out = dense_parts(scores, count, torch.cat([vg, vp], 2))
        return self.dense_prefix_rows(qp, k, v, out)

    def attend_flops(self, grid: Grid) -> int:
        m, d, h, K = grid[0] * grid[1], self.head_dim, self.num_heads, self.num_clusters
        w = self.cluster_size(grid)
        # centroid scores of queries and of keys: qn @ mu and kn @ mu, M·d·K each per head
        flops = 2 * h * m * d * K
        # per cluster: q kᵀ (w·w·d) and attn v (w·w·d) per head
        flops += h * attend_pieces_flops(K, w, w, d)
        return flops + self.prefix_flops(grid)  # prefix keys of the grid queries, prefix queries

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        grid = grid or self.grid
        return {**super().symbols(grid), "K": self.num_clusters, "w": self.cluster_size(grid),
                "P": self.num_prefix, "M": grid[0] * grid[1]}
