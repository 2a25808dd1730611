"""Reformer LSH attention.

Paper: Kitaev, Kaiser and Levskaya, "Reformer: The Efficient Transformer", ICLR 2020,
https://arxiv.org/abs/2001.04451.

* Shared query-key: one projection gives ``q`` and ``v``; keys are the unit-normalised queries
  ``k = q / |q|`` (so the layer has a ``qv`` projection and an output projection: 3NC²).
* Buckets grow with the sequence, as in the paper (which keeps the average bucket near the chunk
  length): ``n_b = ⌈M / bucket_size⌉`` for M grid tokens, rounded up to an even number (>= 2).
* Angular LSH: ``bucket = argmax([xR; -xR])`` with a random rotation ``R[d, n_b/2]`` per head and
  hash round. The rotations are drawn at construction for the construction grid's n_b, from a
  generator seeded by ``layer_index``, and stored as a buffer ``[h, d, n_hashes, n_b/2]``; a
  smaller grid uses the first n_b/2 columns of each round, a grid that needs more buckets is a
  ConfigError. With ``redraw: true`` every *training* forward draws fresh rotations (as the
  paper's trainer does); eval always uses the buffer, so it is deterministic and reloads identically.
* Per round: sort the grid tokens by (bucket, position), cut into chunks of ``c`` tokens; a query
  attends to the keys of its chunk and of the previous chunk (chunk 0 has no previous chunk, no
  wrap-around) that lie in its own bucket (the paper's mask). A token attends to itself only when
  nothing else is available (score - 1e5). A key that shares the query's bucket in r rounds is
  down-weighted by ``- log r`` (the paper's duplicate correction), and the rounds are merged with
  their logsumexp weights. One sort, one gather of ``[q | k | v]`` and one batched matmul cover
  every head, round and chunk; the outputs go back to token order by one scatter.
* Cost: the chunks cost 4·n_h·cLC, linear in M; the hashing costs n_h·(n_b/2)·MC with n_b ∝ M,
  i.e. about n_h·M²C/(2·bucket_size): quadratic with a small constant, so ``linear_cost`` is False.
* Padding: grid tokens are zero-padded to a multiple of ``c``; pad tokens get bucket ``n_b``
  (sorted last, never in a real query's bucket). A chunk longer than the grid shrinks to the grid.
* Prefix tokens (class token): every grid query also attends to the P prefix keys (merged by
  logsumexp with the rounds) and every prefix query attends to all N keys: O(P·N) extra.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, check, check_positive
from vitzoo.attention.data_driven.bucket import (
    BucketAttention,
    attend_pieces,
    attend_pieces_flops,
    ceil_to,
    combine_parts,
    gather_tokens,
    look_back,
    pad_tokens,
    prefix_part,
    unsort,
)
from vitzoo.costs import Saved, itemsize

SELF_PENALTY = 1e5  # subtracted from a token's score with itself (the paper's 10^5)
MAX_HASHES = 8


def self_penalty(dtype: torch.dtype) -> float:
    """:data:`SELF_PENALTY`, or less where the dtype cannot hold it (fp16's largest value is 65504).

    A finite constant, so that the bias converts to the scores' dtype under fp16 autocast and the
    penalised score stays finite; ``e^-4094`` is as much a zero as ``e^-100000``.

    Args:
        dtype: dtype of the scores.
    """
    return min(SELF_PENALTY, torch.finfo(dtype).max / 16)


@dataclass
class ReformerConfig:
    chunk_size: int = 32  # tokens per chunk c after sorting; a query sees its chunk and the previous one
    bucket_size: int = 32  # average grid tokens per hash bucket: n_b = ⌈M / bucket_size⌉ rounded up to even (>= 2)
    n_hashes: int = 2  # hash rounds, 1..8
    redraw: bool = True  # fresh random rotations in every training forward; eval uses the seeded buffer
    pad: bool = True  # pad grid tokens to a multiple of chunk_size; false = error when it does not divide

    def __post_init__(self):
        check_positive(self, "chunk_size", "bucket_size", "n_hashes")
        check(self.n_hashes <= MAX_HASHES, f"attention.n_hashes must be in 1..{MAX_HASHES} (got {self.n_hashes})")


@register_attention("reformer", ReformerConfig)
class ReformerAttention(BucketAttention):
    """LSH attention with shared QK over sorted chunks; its cost is :attr:`formula` (M grid tokens, L padded to chunks).

    Args:
        cfg: :class:`ReformerConfig`.
        ctx: the host's context (``layer_index`` seeds the rotations).
    """

    formula = "3NC² + n_h·(n_b/2)·MC + 4n_h·cLC + 2PMC + 2PNC"

    def __init__(self, cfg: ReformerConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        del self.qkv
        self.qv = nn.Linear(ctx.dim, 2 * ctx.dim, bias=ctx.qkv_bias)  # shared query-key and value
        g = torch.Generator().manual_seed(ctx.layer_index)
        rot = torch.randn(self.num_heads, self.head_dim, cfg.n_hashes, self.n_buckets(ctx.grid) // 2, generator=g)
        self.register_buffer("rotations", rot)  # [h, d, n_hashes, n_b/2] for the construction grid
        self.layout(ctx.grid)

    def n_buckets(self, grid: Grid) -> int:
        """Buckets per round at ``grid``: ``⌈M / bucket_size⌉`` rounded up to an even number, at least 2."""
        n = math.ceil(grid[0] * grid[1] / self.cfg.bucket_size)
        return max(2, n + n % 2)

    def layout(self, grid: Grid) -> tuple[int, int, int]:
        """Chunk length c, padded grid length L and buckets n_b at ``grid``.

        ConfigError when c does not divide the grid with pad off, or when the grid needs more
        buckets than the rotations drawn for the construction grid hold.
        """
        c = min(self.cfg.chunk_size, grid[0] * grid[1])
        m = self.check_pieces("chunk_size", c, grid)
        n_b, held = self.n_buckets(grid), 2 * self.rotations.shape[-1]
        check(n_b <= held, f"attention=reformer needs {n_b} buckets at the {grid[0]}x{grid[1]} grid but was built for "
                           f"the {self.grid[0]}x{self.grid[1]} grid ({held} buckets); build it at the larger grid or "
                           f"raise attention.bucket_size={self.cfg.bucket_size}")
        return c, ceil_to(m, c), n_b

    def split_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``x[B, N, C] -> q, k = q/|q|, v``, each ``[B, h, N, d]``."""
        q, v = self.to_heads(self.qv(x), 2)  # 2 x [B, h, N, d]
        return q, F.normalize(q, dim=-1), v

    def hash(self, x: Tensor, n_b: int) -> Tensor:
        """Angular LSH buckets ``[B, h, n_hashes, M]`` (values in [0, n_b)) of ``x[B, h, M, d]``."""
        rot = self.rotations[..., :n_b // 2]  # [h, d, n_hashes, n_b/2]
        if self.training and self.cfg.redraw:
            rot = torch.randn_like(rot)
        with torch.no_grad():  # argmax has no gradient: autograd keeps nothing of the projection
            proj = x @ rot.flatten(-2)  # [B, h, M, n_hashes·n_b/2]
        proj = proj.unflatten(-1, (self.cfg.n_hashes, -1))  # [B, h, M, n_hashes, n_b/2]
        # contiguous: the sort order then flattens as a view, and the gather keeps no int64 copy of it
        return torch.cat([proj, -proj], dim=-1).argmax(dim=-1).transpose(-1, -2).contiguous()  # [B, h, n_hashes, M]

    def padded_buckets(self, k_grid: Tensor, length: int, n_b: int) -> Tensor:
        """Buckets ``[B, h, R, length]`` of the grid keys ``[B, h, M, d]``; the pad tokens get bucket n_b."""
        return F.pad(self.hash(k_grid, n_b), (0, length - k_grid.shape[-2]), value=n_b)

    def chunk_bias(self, buckets: Tensor, order: Tensor, c: int, dtype: torch.dtype) -> Tensor:
        """Additive bias ``[B, h, R, nc, c, 2c]`` of every chunk: bucket mask, self penalty, duplicates.

        Args:
            buckets: ``[B, h, R, L]`` bucket of every (padded) token in every round.
            order: ``[B, h, R, L]`` tokens in sorted order for every round.
            c: chunk length.
            dtype: dtype of the bias (the scores').
        """
        R = buckets.shape[2]
        codes = gather_tokens(buckets.transpose(-2, -1), order).unflatten(-2, (-1, c))  # [B, h, R, nc, c, R] all rounds
        keys = look_back(codes, dim=-3, fill=-1)  # [B, h, R, nc, 2c, R], -1 = no key
        # [B, h, R, nc, c, 2c]
        shared = torch.zeros(keys.shape[:-2] + (c, 2 * c), dtype=torch.uint8, device=codes.device)
        for r in range(R):  # rounds in which query and key share a bucket (one byte per pair, not R)
            shared += codes[..., r].unsqueeze(-1) == keys[..., r].unsqueeze(-2)
        bq = codes.diagonal(dim1=2, dim2=-1).movedim(-1, 2)  # [B, h, R, nc, c] bucket in the chunk's own round
        bk = look_back(bq, dim=-2, fill=-1)  # [B, h, R, nc, 2c], -1 = no key
        tq = order.unflatten(-1, (-1, c))  # [B, h, R, nc, c] token of each query slot
        tk = look_back(tq, dim=-2, fill=-1)  # [B, h, R, nc, 2c]
        bias = -shared.clamp_min(1).to(dtype).log()  # duplicate correction -log(rounds shared)
        bias = bias.masked_fill(bq.unsqueeze(-1) != bk.unsqueeze(-2), float("-inf"))  # other bucket / no key
        return bias.masked_fill(tq.unsqueeze(-1) == tk.unsqueeze(-2), -self_penalty(dtype) - math.log(R))  # self

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        P = self.num_prefix
        c, length, n_b = self.layout(grid)
        (qp, qg), (kp, kg), (vp, vg) = self.split_prefix_qkv(q, k, v)
        m, d = qg.shape[-2:]
        buckets = self.padded_buckets(kg, length, n_b)  # [B, h, R, L]
        pos = torch.arange(length, device=q.device)
        order = (buckets * length + pos).argsort(dim=-1)  # [B, h, R, L] by (bucket, position): the one sort
        qkv = gather_tokens(pad_tokens(torch.cat([qg, kg, vg], -1), length), order)  # [B, h, R, L, 3d] one gather
        qkv = qkv.unflatten(-2, (-1, c))  # [B, h, R, nc, c, 3d]
        ks, vs = look_back(qkv[..., d:], dim=-3).split(d, dim=-1)  # [B, h, R, nc, 2c, d] each
        qs = qkv[..., :d]  # [B, h, R, nc, c, d]
        bias = self.chunk_bias(buckets, order, c, q.dtype)  # [B, h, R, nc, c, 2c]
        out, lse = attend_pieces(qs, ks, vs, self.scale, bias, self.attn_drop)  # [B, h, R, nc, c, d], [.., c]
        out = unsort(out.flatten(-3, -2), order)[..., :m, :]  # [B, h, R, M, d]
        lse = unsort(lse.flatten(-2).unsqueeze(-1), order)[..., :m, 0]  # [B, h, R, M]
        if P:
            out_p, lse_p = prefix_part(qg, kp, vp, self.scale, self.attn_drop)
            out = torch.cat([out, out_p.unsqueeze(2)], dim=2)  # [B, h, R + 1, M, d]
            lse = torch.cat([lse, lse_p.unsqueeze(2)], dim=2)
        out_g = combine_parts(out, lse, dim=2)  # [B, h, M, d]
        return self.prefix_rows(qp, k, v, out_g, self.prefix_bias(q))

    def prefix_bias(self, q: Tensor) -> Tensor:
        """``[P, N]`` self penalty of the prefix queries (prefix token p is key p)."""
        P, N = self.num_prefix, q.shape[-2]
        return -self_penalty(q.dtype) * torch.eye(P, N, dtype=q.dtype, device=q.device)

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        """Dense ``[M, M]`` masks per round (same bucket, chunk(j) in {chunk(i), chunk(i) - 1}), one joint softmax.

        The chunk of token i is its rank in the round's order by (bucket, position), divided by c;
        the rank counts the tokens before i (pad tokens sort after every real token).
        """
        P = self.num_prefix
        c, _, n_b = self.layout(grid)
        (qp, qg), (kp, kg), (vp, vg) = self.split_prefix_qkv(q, k, v)
        m = qg.shape[-2]
        b = self.hash(kg, n_b)  # [B, h, R, M]
        bi, bj = b.unsqueeze(-1), b.unsqueeze(-2)  # query i along -2, key j along -1
        pos = torch.arange(m, device=q.device)
        before = (bj < bi) | ((bj == bi) & (pos < pos.unsqueeze(-1)))  # [B, h, R, M, M] j sorts before i
        chunk = before.sum(-1) // c  # [B, h, R, M] chunk of every grid token
        same = bi == bj  # [B, h, R, M, M]
        gap = chunk.unsqueeze(-1) - chunk.unsqueeze(-2)  # query chunk - key chunk
        shared = same.sum(2, keepdim=True)  # [B, h, 1, M, M] rounds in which i and j share a bucket
        scores = (qg @ kg.transpose(-2, -1)).unsqueeze(2) * self.scale  # [B, h, 1, M, M]
        scores = scores - shared.clamp_min(1).to(q.dtype).log()
        scores = scores - self_penalty(q.dtype) * torch.eye(m, dtype=q.dtype, device=q.device)
        scores = scores.masked_fill(~(same & ((gap == 0) | (gap == 1))), float("-inf"))  # [B, h, R, M, M]
        # one softmax over the multiset union of the rounds' keys (and the prefix keys)
        scores = scores.transpose(2, 3).flatten(-2)  # [B, h, M, R·M]
        values = vg.repeat(1, 1, self.cfg.n_hashes, 1)  # [B, h, R·M, d]
        if P:
            scores = torch.cat([scores, (qg @ kp.transpose(-2, -1)) * self.scale], dim=-1)  # [B, h, M, R·M + P]
            values = torch.cat([values, vp], dim=-2)
        out = scores.softmax(-1) @ values  # [B, h, M, d]
        return self.dense_prefix_rows(qp, k, v, out, self.prefix_bias(q))

    def projection_flops(self, n: int) -> int:
        """Shared query-key and value projection ``2nC²`` plus output projection ``nC²``."""
        return 3 * n * self.dim * self.dim

    def projection_memory(self, n: int, batch: int, amp: Optional[torch.dtype],
                          input_dtype: Optional[torch.dtype] = None) -> list[Saved]:
        """The ``qv`` and output projections' inputs and, under ``amp``, their weights' autocast copies (one product
        reads the input: the same for any ``input_dtype``)."""
        C, size = self.dim, itemsize(amp)
        items = [Saved("qv input", batch * n * C, size), Saved("proj input", batch * n * C, size)]
        if amp is not None:
            items += [Saved("qv weight (autocast copy)", 2 * C * C, size),
                      Saved("proj weight (autocast copy)", C * C, size)]
        return items

    def attend_memory(self, grid: Grid, batch: int, amp: Optional[torch.dtype]) -> list[Saved]:
        """Shapes only (buckets change which tokens share a chunk, not the sizes). Every op runs in the q/v
        projection's dtype under autocast. The prefix keys and values go through batched matmuls that copy them
        unless the batch or the heads axis has length 1 (then they are views of k and of the q|v storage)."""
        c, L, _ = self.layout(grid)
        B, h, d, C, size = batch, self.num_heads, self.head_dim, self.dim, itemsize(amp)
        N, M, P, R = self.seq_len(grid), grid[0] * grid[1], self.num_prefix, self.cfg.n_hashes
        items = [Saved("q|v (projection output)", B * N * 2 * C, size),  # [B, N, 2C]: F.normalize keeps q
                 Saved("query norms", B * h * N, size),  # [B, h, N, 1]
                 Saved("query norms (clamped)", B * h * N, size),  # [B, h, N, 1]: the divisor of k = q/|q|
                 Saved("sort order", B * h * R * L, 8),  # [B, h, R, L] int64: the gather's and unsort's index
                 Saved("q|k|v grid tokens (padded)", B * h * L * 3 * d, size),  # [B, h, L, 3d]: gather input
                 Saved("chunk keys|values with the previous chunk", B * h * R * L * 4 * d, size),  # [B,h,R,nc,2c,2d]
                 Saved("chunk queries (scaled)", B * h * R * L * d, size),  # [B, h, R, nc, c, d]
                 Saved("chunk scores", B * h * R * L * 2 * c, size),  # [B, h, R, nc, c, 2c]: logsumexp input
                 Saved("chunk attention weights", B * h * R * L * 2 * c, size),  # [B, h, R, nc, c, 2c]
                 Saved("chunk log-sum-exp", B * h * R * L, size)]  # [B, h, R, nc, c]
        if not P:
            return items + [Saved("round outputs (token order)", B * h * R * L * d, size),  # [B, h, R, L, d]
                            Saved("round weights", B * h * R * M, size)]  # [B, h, R, M]: softmax of the lse
        items += [Saved("grid queries (scaled)", B * h * M * d, size),  # [B, h, M, d]: vs the prefix keys
                  Saved("prefix-key scores", B * h * M * P, size),  # [B, h, M, P]
                  Saved("prefix-key weights", B * h * M * P, size),  # [B, h, M, P]
                  Saved("prefix-key log-sum-exp", B * h * M, size),  # [B, h, M]
                  Saved("part weights", B * h * (R + 1) * M, size),  # [B, h, R + 1, M]: rounds and prefix part
                  Saved("part outputs", B * h * (R + 1) * M * d, size),  # [B, h, R + 1, M, d]
                  Saved("prefix queries (scaled)", B * h * P * d, size),  # [B, h, P, d]
                  Saved("prefix-query weights", B * h * P * N, size)]  # [B, h, P, N]
        if B == 1 or h == 1:  # the matmuls view k and v: k = q/|q| is one storage, v is the projection's
            return items + [Saved("keys (normalised)", B * N * C, size)]  # [B, h, N, d]
        return items + [Saved("prefix keys (matmul copy)", B * h * d * P, size),  # [B·h, d, P]
                        Saved("prefix values (matmul copy)", B * h * P * d, size),  # [B·h, P, d]
                        Saved("keys (matmul copy)", B * h * d * N, size),  # [B·h, d, N]
                        Saved("values (matmul copy)", B * h * N * d, size)]  # [B·h, N, d]

    def attend_flops(self, grid: Grid) -> int:
        c, length, n_b = self.layout(grid)
        m, R, d, h = grid[0] * grid[1], self.cfg.n_hashes, self.head_dim, self.num_heads
        # hashing x @ rotations: M·d·(R·n_b/2) per head
        flops = h * m * d * R * n_b // 2
        # per round and chunk: q kᵀ (c·2c·d) and attn v (c·2c·d) per head
        flops += h * attend_pieces_flops(R * length // c, c, 2 * c, d)
        return flops + self.prefix_flops(grid)  # prefix keys of the grid queries, prefix queries

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        grid = grid or self.grid
        c, length, n_b = self.layout(grid)  # L: grid tokens padded to a multiple of the chunk c
        return {
            **super().symbols(grid),
            "n_h": self.cfg.n_hashes,
            "n_b": n_b,
            "c": c,
            "P": self.num_prefix,
            "M": grid[0] * grid[1],
            "L": length,
        }
