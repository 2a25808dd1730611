"""Plain references of the routing heads (none of the fast path's code): the nearest-centroid decision one (image,
head) at a time, and dense attention masked to the clusters."""
from __future__ import annotations

import torch
from torch import Tensor

from vitzoo.attention.functional import dense_attention


def naive_nearest(x: Tensor, centroids: Tensor) -> Tensor:
    """Reference decision: the index of the centroid at the smallest Euclidean distance from each unit-normalised
    row of ``x``, one (image, head) at a time (none of the fast path's code).

    Args:
        x: ``[B, h, T, d]`` queries or keys.
        centroids: ``[h, K, d]`` unit centroids.

    Returns:
        ``[B, h, T]`` centroid indices.
    """
    B, h, T, _ = x.shape
    out = torch.empty(B, h, T, dtype=torch.long, device=x.device)
    for b in range(B):
        for head in range(h):
            rows = x[b, head] / x[b, head].norm(dim=-1, keepdim=True).clamp_min(1e-12)  # [T, d]
            out[b, head] = ((centroids[head][None] - rows[:, None]) ** 2).sum(-1).argmin(-1)  # [T, K] -> [T]
    return out


def routed_reference(q: Tensor, k: Tensor, v: Tensor, kp: Tensor, vp: Tensor, c_q: Tensor, c_k: Tensor) -> Tensor:
    """Reference of the routing heads given the decision: dense attention masked to the keys in the query's
    cluster (its own key too where that cluster holds none) and the prefix keys.

    Args:
        q, k, v: ``[B, h, M, d]`` grid queries, keys, values; kp, vp: ``[B, h, P, d]`` prefix keys, values.
        c_q, c_k: ``[B, h, M]`` the cluster of every query and of every key.
    """
    allowed = c_q[..., :, None] == c_k[..., None, :]  # [B, h, M, M]
    allowed = allowed | torch.diag_embed(allowed.sum(-1) == 0)
    allowed = torch.cat([torch.ones_like(allowed[..., :1]).expand(-1, -1, -1, kp.shape[2]), allowed], -1)
    return dense_attention(q, torch.cat([kp, k], 2), torch.cat([vp, v], 2), allowed=allowed)
