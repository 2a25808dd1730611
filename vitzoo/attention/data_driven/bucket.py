"""Shared sort / chunk / gather / unsort helpers of the data-driven sparse backends.

Used by ``reformer`` (LSH buckets), ``routing`` (k-means clusters) and ``sinkhorn`` (sorted blocks).
Every backend follows the same recipe: choose an order or a membership of the grid tokens from the
data, gather the tokens into small equal pieces, run dense attention inside each piece
(:func:`attend_pieces`, which also returns the log-normaliser), then put the outputs back in token
order and merge the partial results of one query with their logsumexp weights
(:func:`combine_parts`, :func:`scatter_combine`). Merging by logsumexp is exact: a query that
attends to key sets S1 and S2 separately and merges gets the softmax over the multiset S1 + S2.

Prefix tokens (ViT's class token) are kept out of the sparse pattern: every grid query also
attends to the P prefix keys (one extra part, :func:`prefix_part`), and every prefix query
attends densely to all N keys (:func:`attend_pieces` on the whole sequence): O(P·N) extra cost.

Gathers, sorts, scatters and logsumexps count 0 FLOPs; the matmuls in :func:`attend_pieces` are
written with ``@`` on tensors that carry every batch dimension, so fvcore counts them exactly.

:class:`BucketAttention` is the backends' common base: the checks of the piece size against
the grid (``attention.pad``) and the prefix rows, their reference and their cost.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitzoo.attention.base import Grid, QKVAttention, check, check_positive


def ceil_to(n: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``n``."""
    return math.ceil(n / multiple) * multiple


def split_prefix(t: Tensor, num_prefix: int) -> tuple[Tensor, Tensor]:
    """``t[..., P + M, d] -> (t[..., :P, d], t[..., P:, d])``."""
    return t[..., :num_prefix, :], t[..., num_prefix:, :]


def pad_tokens(t: Tensor, length: int) -> Tensor:
    """Zero-pad the token axis (-2) of ``t[..., M, d]`` to ``length``."""
    return F.pad(t, (0, 0, 0, length - t.shape[-2]))


def gather_tokens(t: Tensor, index: Tensor) -> Tensor:
    """Pick tokens of ``t[B, h, M, d]`` by ``index[B, h, *S]`` (values in [0, M)) -> ``[B, h, *S, d]``."""
    B, h, _, d = t.shape
    flat = index.reshape(B, h, -1, 1).expand(-1, -1, -1, d)  # [B, h, prod(S), d]
    return t.gather(2, flat).reshape(*index.shape, d)  # [B, h, *S, d]


def unsort(t: Tensor, order: Tensor) -> Tensor:
    """Put sorted rows ``t[..., L, e]`` back in token order: row i goes to token ``order[..., i]`` (one scatter).

    Args:
        t: rows in sorted order; order: ``[..., L]``, the token of every sorted row (a permutation).
    """
    return torch.zeros_like(t).scatter(-2, order.unsqueeze(-1).expand_as(t), t)


def look_back(t: Tensor, dim: int, fill: float = 0) -> Tensor:
    """Append to every chunk the chunk before it (no wrap-around: chunk 0 gets ``fill``).

    Args:
        t: chunked tensor, chunk axis ``dim`` (negative) followed by the within-chunk axis.
        dim: the chunk axis, counted from the end (e.g. -3 for ``[..., nc, c, d]``).
        fill: value of the missing chunk before chunk 0 (a masked id or zeros).
    """
    first = torch.full_like(t.narrow(dim, 0, 1), fill)
    prev = torch.cat([first, t.narrow(dim, 0, t.shape[dim] - 1)], dim)  # chunk j holds chunk j-1
    return torch.cat([t, prev], dim + 1)  # within-chunk axis doubles: [..., nc, 2c, ...]


def attend_pieces(q: Tensor, k: Tensor, v: Tensor, scale: float, bias: Optional[Tensor] = None,
                  drop: Optional[nn.Module] = None, lse: bool = True) -> tuple[Tensor, Optional[Tensor]]:
    """Dense attention inside each piece: ``softmax(q kᵀ·scale + bias) v`` and its log-normaliser.

    Args:
        q: ``[..., n, d]`` queries of every piece; k, v: ``[..., m, d]`` its keys and values
            (the same leading dims as ``q``, so fvcore counts ``n·m·d`` per piece for each matmul).
        scale: multiplier of the scores (1/√d).
        bias: additive ``[..., n, m]`` (broadcastable), ``-inf`` where a key is masked; every row
            must keep at least one key.
        drop: dropout on the attention weights (training only).
        lse: compute the log-normaliser; False returns None in its place (and autograd keeps no scores).

    Returns:
        ``out[..., n, d]`` and ``lse[..., n]`` (logsumexp of the biased scores of each row) or None.
    """
    scores = (q * scale) @ k.transpose(-2, -1)  # [..., n, m]
    if bias is not None:
        scores = scores + bias
    attn = scores.softmax(dim=-1)
    if drop is not None:
        attn = drop(attn)
    return attn @ v, scores.logsumexp(dim=-1) if lse else None


def attend_pieces_flops(pieces: int, n: int, m: int, d: int) -> int:
    """MACs of :func:`attend_pieces`: ``q kᵀ`` is n·m·d and ``attn v`` is n·m·d, per piece."""
    return 2 * pieces * n * m * d


def prefix_part(q_grid: Tensor, k_pre: Tensor, v_pre: Tensor, scale: float,
                drop: Optional[nn.Module] = None) -> tuple[Tensor, Tensor]:
    """Grid queries ``[B, h, M, d]`` against the P prefix keys/values ``[B, h, P, d]``: (out, lse)."""
    return attend_pieces(q_grid, k_pre, v_pre, scale, drop=drop)


def combine_parts(out: Tensor, lse: Tensor, dim: int) -> Tensor:
    """Merge partial attention results of the same queries by their logsumexp weights.

    Args:
        out: ``[..., R, M, d]`` partial outputs (R parts along ``dim``).
        lse: ``[..., R, M]`` their log-normalisers.
        dim: the parts axis of ``out`` (and of ``lse``).
    """
    w = lse.softmax(dim=dim if dim >= 0 else dim + 1).unsqueeze(-1)  # [..., R, M, 1]
    return (out * w).sum(dim=dim)


def scatter_combine(out: Tensor, lse: Tensor, index: Tensor, length: int,
                    extra: Optional[tuple[Tensor, Tensor]] = None) -> Tensor:
    """Merge per-piece results back to tokens when a token may sit in several pieces (or none).

    Token t gets ``Σ exp(lse_i) out_i / Σ exp(lse_i)`` over the pieces i holding it (plus ``extra``);
    a token in no piece and without ``extra`` gets 0.

    Args:
        out: ``[B, h, K, w, d]`` outputs of K pieces of w queries; lse: ``[B, h, K, w]``.
        index: ``[B, h, K, w]`` token index of every query slot.
        length: number of tokens M.
        extra: optional ``(out[B, h, M, d], lse[B, h, M])`` part every token has (prefix keys).
    """
    B, h, K, w, d = out.shape
    flat = index.reshape(B, h, K * w)  # [B, h, K·w]
    lse = lse.reshape(B, h, K * w)  # [B, h, K·w]
    with torch.no_grad():  # the stabiliser only: autograd keeps nothing of it
        m = lse.new_full((B, h, length), float("-inf")).scatter_reduce(2, flat, lse, "amax")  # [B, h, M]
        if extra is not None:
            m = torch.maximum(m, extra[1])
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    wts = (lse - m.gather(2, flat)).exp()  # [B, h, K·w]
    num = out.new_zeros(B, h, length, d).scatter_add(2, flat.unsqueeze(-1).expand(-1, -1, -1, d),
                                                     out.reshape(B, h, K * w, d) * wts.unsqueeze(-1))
    den = wts.new_zeros(B, h, length).scatter_add(2, flat, wts)  # [B, h, M]
    if extra is not None:
        w_extra = (extra[1] - m).exp()
        num = num + extra[0] * w_extra.unsqueeze(-1)
        den = den + w_extra
    return num / den.clamp_min(torch.finfo(den.dtype).tiny).unsqueeze(-1)


def dense_parts(scores: Tensor, weight: Tensor, v: Tensor) -> Tensor:
    """Reference helper: ``Σ_j weight_ij exp(s_ij) v_j / Σ_j weight_ij exp(s_ij)`` (0 where no key).

    Args:
        scores: ``[..., M, K]`` scores; weight: ``[..., M, K]`` non-negative multiplicities;
        v: ``[..., K, d]``.
    """
    scores = scores.masked_fill(weight <= 0, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = weight * (scores - m).exp()  # [..., M, K]
    return (p @ v) / p.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)


def check_auto_size(cfg: Any, name: str) -> None:
    """``attention.<name>`` is null (:func:`auto_size` picks it) or a positive integer."""
    if getattr(cfg, name) is not None:
        check_positive(cfg, name)


def auto_size(value: Optional[int], grid: Grid) -> int:
    """``value``, or ``⌈√M⌉`` for the M = H·W grid tokens when it is null (O(M^1.5) pieces)."""
    return value or math.ceil(math.sqrt(grid[0] * grid[1]))


class BucketAttention(QKVAttention):
    """Base of ``reformer``, ``routing`` and ``sinkhorn``: grid tokens in data-chosen pieces, prefix dense.

    The config has ``pad`` (allow a piece size that does not divide the grid tokens). Grid queries
    also attend to the P prefix keys (the backend merges that part); prefix queries attend to all
    N keys (:meth:`prefix_rows`, :meth:`dense_prefix_rows`, :meth:`prefix_flops`).
    """


    def split_prefix_qkv(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[tuple[Tensor, Tensor], ...]:
        """``(qp, qg), (kp, kg), (vp, vg)``: prefix ``[B, h, P, d]`` and grid ``[B, h, M, d]`` parts."""
        P = self.num_prefix
        return split_prefix(q, P), split_prefix(k, P), split_prefix(v, P)

    def check_pieces(self, name: str, size: int, grid: Grid) -> int:
        """``attention.<name>`` (value ``size``) cuts the M grid tokens: at most M, and a divisor of M
        unless ``attention.pad``. Returns M."""
        (H, W), m = grid, grid[0] * grid[1]
        check(size <= m, f"attention.{name}={size} is more than the {m} tokens of the {H}x{W} grid")
        check(self.cfg.pad or m % size == 0,
              f"attention.{name}={size} does not divide the {m} tokens of the {H}x{W} grid; "
              f"set attention.pad=true or pick a divisor")
        return m

    def prefix_rows(self, qp: Tensor, k: Tensor, v: Tensor, out_grid: Tensor,
                    bias: Optional[Tensor] = None) -> Tensor:
        """Prefix queries ``qp[B, h, P, d]`` attend densely to all keys; their rows go before ``out_grid``.

        Args:
            qp: prefix queries; k, v: all N keys and values ``[B, h, N, d]``.
            out_grid: the grid queries' outputs ``[B, h, M, d]``.
            bias: additive ``[P, N]`` bias of the prefix scores, or None.
        """
        if not self.num_prefix:
            return out_grid
        out_pre, _ = attend_pieces(qp, k, v, self.scale, bias, self.attn_drop, lse=False)  # [B, h, P, d]
        return torch.cat([out_pre, out_grid], dim=2)

    def dense_prefix_rows(self, qp: Tensor, k: Tensor, v: Tensor, out_grid: Tensor,
                          bias: Optional[Tensor] = None) -> Tensor:
        """Reference of :meth:`prefix_rows`: ``softmax(qp kᵀ·scale + bias) v`` written out."""
        if not self.num_prefix:
            return out_grid
        scores = (qp @ k.transpose(-2, -1)) * self.scale  # [B, h, P, N]
        if bias is not None:
            scores = scores + bias
        return torch.cat([scores.softmax(-1) @ v, out_grid], dim=2)

    def prefix_flops(self, grid: Grid) -> int:
        """MACs of the prefix parts: grid queries vs prefix keys and prefix queries vs all keys."""
        m, P, d, h = grid[0] * grid[1], self.num_prefix, self.head_dim, self.num_heads
        # grid queries vs prefix keys: q kᵀ (M·P·d) and attn v (M·P·d) per head
        flops = h * attend_pieces_flops(1, m, P, d)
        # prefix queries vs all keys: q kᵀ (P·N·d) and attn v (P·N·d) per head
        return flops + h * attend_pieces_flops(1, P, P + m, d)
