"""Sparse Sinkhorn attention: learned soft sorting of blocks.

Paper: Tay, Bahri, Yang, Metzler and Juan, "Sparse Sinkhorn Attention", ICML 2020,
https://arxiv.org/abs/2002.11296.

* Blocks: the M grid tokens are cut into nb blocks of b tokens (zero-padded to nb·b).
* Sorting network (``sort_net: input``, the paper's SortNet, Section 3.1): the layer input X (before the
  q/k/v projection) is pooled per block by its sum over the block's grid tokens, ``X̄_i = Σ_{t ∈ block i} x_t``
  (C wide; pad tokens add 0), and goes through a two-layer net ``C -> s -> h·nb``, ReLU after each layer
  (the paper's non-negative sorting logits): ``score = relu(W2 relu(W1 X̄_i + b1) + b2)``, one row of nb
  logits per head, ``score_ij`` block i's logit for position j in that head. The paper's net has one
  output row (one sorting shared by the heads); here every head reads its own nb outputs of the same
  hidden layer, so the heads may sort differently (h = 1 is the paper's net).
  ``sort_net: keys``, an option: per head, each block's keys are pooled (their mean over the block's real
  tokens) and go through a two-layer net ``d -> s -> nb`` with a ReLU between (:class:`HeadLinear` maps,
  weights ``[h, d, s]`` and ``[h, s, nb]``). The output width of both is the number of blocks at
  construction, so they run at grids with that many blocks (another count is a ConfigError).
  ``sort_net: bilinear``, an option: the mean query of block i and the mean key of block j go through two
  linear maps ``d -> s`` and ``score_ij = <f_h(q̄_i), g_h(k̄_j)> / √s`` (any grid).
* Gumbel-Sinkhorn (the paper's): in training, ``noise·ε`` with Gumbel noise
  ``ε = -log(-log U)``, U uniform, is added to the scores; eval adds none (deterministic).
* Sinkhorn normalisation (differentiable): ``log R = score / temperature``, then ``iters`` rounds
  of column then row normalisation in log space; ``R[nb, nb]`` is a soft permutation matrix.
* Sorted blocks: ``K̃_i = Σ_j R_ij K_j`` and ``Ṽ_i = Σ_j R_ij V_j`` (one block matmul on the
  keys and values side by side). Queries of block i attend to the keys of their own block and of
  sorted block i: one batched matmul over all heads and blocks ([B, h, nb, b, 2b] scores).
  Gradients reach the sorting network through R.
* Padding: pad keys of the local block are masked; a sorted slot t of block i carries weight
  ``Σ_j R_ij·valid_j[t] = 1 - R_i,last`` where the last block is padded (its share of real keys),
  added to its score as ``log`` weight. Without padding every weight is 1 (no bias).
* Cost: 4LbC for the block attention, 2·nb·LC for the soft permutation and nb·sC + h·nb²·s for the
  sorting net (``input``: C -> s and s -> h·nb on nb block sums; ``keys``: d -> s and s -> nb per head;
  ``bilinear``: 2·nb·sC + h·nb²·s; block sums and means count 0), so O(N²/b); the
  default b = ⌈√M⌉ makes both O(N^1.5) (``linear_cost`` is False).
* Prefix tokens (class token): they are not sorted. Every grid query also attends to the P prefix
  keys (merged by logsumexp) and every prefix query attends to all N keys: O(P·N) extra.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, check, check_positive, check_positive_number
from vitzoo.attention.data_driven.bucket import (
    BucketAttention,
    attend_pieces,
    attend_pieces_flops,
    auto_size,
    ceil_to,
    check_auto_size,
    combine_parts,
    dense_parts,
    pad_tokens,
    prefix_part,
)
from vitzoo.costs import Saved, itemsize

MAX_ITERS = 100
SORT_NETS = ("input", "keys", "bilinear")  # attention.sort_net


@dataclass
class SinkhornConfig:
    block_size: Optional[int] = None  # tokens per block b; null = ⌈√M⌉ for M grid tokens
    sort_dim: int = 16  # width s of each head's sorting-network block embeddings
    iters: int = 8  # Sinkhorn normalisation rounds, 1..100
    temperature: float = 0.75  # divides the block-pair scores before Sinkhorn (lower = harder sort)
    noise: float = 1.0  # scale of the Gumbel noise on the block-pair scores in training, >= 0 (0: none); none in eval
    pad: bool = True  # pad grid tokens to a multiple of block_size; false = error when it does not divide
    sort_net: str = "input"  # input: block sums of X -> C -> s -> h·nb (the paper's SortNet); keys; bilinear

    def __post_init__(self):
        check_auto_size(self, "block_size")
        check(self.sort_net in SORT_NETS, f"attention.sort_net must be one of {', '.join(SORT_NETS)} "
                                          f"(got {self.sort_net!r})")
        check_positive(self, "sort_dim", "iters")
        check(self.iters <= MAX_ITERS, f"attention.iters must be in 1..{MAX_ITERS} (got {self.iters})")
        check_positive_number(self, "temperature")
        check(isinstance(self.noise, (int, float)) and not isinstance(self.noise, bool) and self.noise >= 0,
              f"attention.noise must be a non-negative number (got {self.noise!r})")


def gumbel_like(t: Tensor) -> Tensor:
    """Standard Gumbel noise ``-log(-log U)`` shaped and typed like ``t`` (drawn in float32).

    Args:
        t: the scores the noise is added to.
    """
    eps = torch.finfo(torch.float32).eps
    u = torch.rand(t.shape, device=t.device).clamp(eps, 1 - eps)  # U(0, 1) kept off 0 and 1
    return (-torch.log(-torch.log(u))).to(t.dtype)


class HeadLinear(nn.Module):
    """One linear map ``d -> s`` per head: ``x[B, h, n, d] -> [B, h, n, s]``.

    Args:
        heads: h.
        dim_in: d.
        dim_out: s.
    """

    def __init__(self, heads: int, dim_in: int, dim_out: int):
        super().__init__()
        bound = dim_in ** -0.5  # nn.Linear's default init range
        self.weight = nn.Parameter(torch.empty(heads, dim_in, dim_out).uniform_(-bound, bound))  # [h, d, s]
        self.bias = nn.Parameter(torch.empty(heads, 1, dim_out).uniform_(-bound, bound))  # [h, 1, s]

    def forward(self, x: Tensor) -> Tensor:
        """``x[B, h, n, d] -> [B, h, n, s]``, head i through its own map (n·d·s MACs per head)."""
        return x @ self.weight + self.bias  # [B, h, n, d] @ [h, d, s] -> [B, h, n, s]


@register_attention("sinkhorn", SinkhornConfig)
class SinkhornAttention(BucketAttention):
    """Local block plus Sinkhorn-sorted block attention; its cost is :attr:`formula` (L padded grid tokens, s sort dim).

    Args:
        cfg: :class:`SinkhornConfig`.
        ctx: the host's context.
    """

    formula = "4NC² + 4LbC + 2·nb·LC + nb·sC + h·nb²·s + 2PMC + 2PNC"

    def __init__(self, cfg: SinkhornConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        self.num_blocks = self.layout(ctx.grid)[1]
        if cfg.sort_net == "input":
            self.sort_hidden = nn.Linear(self.dim, cfg.sort_dim)  # block sum of X -> s
            self.sort_out = nn.Linear(cfg.sort_dim, self.num_heads * self.num_blocks)  # s -> nb logits per head
        elif cfg.sort_net == "keys":
            self.sort_hidden = HeadLinear(self.num_heads, self.head_dim, cfg.sort_dim)  # pooled block -> s
            self.sort_out = HeadLinear(self.num_heads, cfg.sort_dim, self.num_blocks)  # s -> one logit per block
        else:
            self.sort_q = HeadLinear(self.num_heads, self.head_dim, cfg.sort_dim)  # block query embedding f_h
            self.sort_k = HeadLinear(self.num_heads, self.head_dim, cfg.sort_dim)  # block key embedding g_h

    def sort_scores(self, xg: Optional[Tensor], qb: Tensor, kb: Tensor, m: int) -> Tensor:
        """Block-pair scores ``[B, h, nb, nb]`` of the sorting network (before noise and temperature).

        Args:
            xg: the grid tokens of the layer input ``[B, M, C]`` (read by ``sort_net: input`` only).
            qb, kb: query and key blocks ``[B, h, nb, b, d]`` (zero-padded).
            m: real grid tokens.
        """
        nb, b = qb.shape[2], qb.shape[3]
        net = self.cfg.sort_net
        check(net == "bilinear" or nb == self.num_blocks,
              f"attention.sort_net={net} was built for {self.num_blocks} blocks and this grid has {nb}; "
              f"use a grid with as many blocks or attention.sort_net=bilinear")
        if net == "input":
            sums = pad_tokens(xg, nb * b).unflatten(-2, (nb, b)).sum(-2)  # [B, nb, b, C] -> [B, nb, C] block sums
            logits = torch.relu(self.sort_out(torch.relu(self.sort_hidden(sums))))  # [B, nb, h·nb], non-negative
            logits = logits.unflatten(-1, (self.num_heads, nb))  # [B, nb, h, nb]
            return logits.transpose(1, 2).contiguous()  # [B, h, nb, nb]: head, block i, position j
        count = (torch.arange(nb * b, device=qb.device) < m).view(nb, b).sum(-1, keepdim=True)  # [nb, 1] real tokens
        k_mean = kb.sum(-2) / count  # [B, h, nb, d]
        if net == "bilinear":
            q_mean = qb.sum(-2) / count  # [B, h, nb, d]
            return self.sort_q(q_mean) @ self.sort_k(k_mean).transpose(-2, -1) / math.sqrt(self.cfg.sort_dim)
        return self.sort_out(torch.relu(self.sort_hidden(k_mean)))  # [B, h, nb, nb]: block i's logit per position

    def layout(self, grid: Grid) -> tuple[int, int]:
        """Block size b and number of blocks nb at ``grid`` (ConfigError when b is out of range or does not divide)."""
        b = auto_size(self.cfg.block_size, grid)
        m = self.check_pieces("block_size", b, grid)
        return b, ceil_to(m, b) // b

    def sort_matrix(self, xg: Optional[Tensor], qb: Tensor, kb: Tensor, m: int) -> Tensor:
        """Soft permutation ``R[B, h, nb, nb]`` of every head (Gumbel noise in training).

        Args:
            xg: the grid tokens of the layer input ``[B, M, C]`` (``sort_net: input``; None for the others).
            qb, kb: query and key blocks ``[B, h, nb, b, d]`` (zero-padded).
            m: real grid tokens.
        """
        scores = self.sort_scores(xg, qb, kb, m)
        if self.training and self.cfg.noise:
            scores = scores + self.cfg.noise * gumbel_like(scores)
        log_r = scores / self.cfg.temperature
        for _ in range(self.cfg.iters):
            log_r = log_r - log_r.logsumexp(dim=-2, keepdim=True)  # columns sum to 1
            log_r = log_r - log_r.logsumexp(dim=-1, keepdim=True)  # rows sum to 1
        return log_r.exp()

    def block_bias(self, r: Tensor, b: int, m: int) -> Tensor:
        """Additive bias ``[B, h, nb, 1, 2b]`` of the local and sorted keys of every block.

        Pad keys of the local block are masked; sorted slot t of block i gets ``log(1 - R_i,last)``
        when slot t of the last block is padding (its share of real keys), 0 otherwise.

        Args:
            r: soft permutation ``[B, h, nb, nb]``.
            b: block size.
            m: real grid tokens.
        """
        nb = r.shape[-1]
        pad = torch.arange(nb * b, device=r.device).view(nb, b) >= m  # [nb, b] pad tokens (last block only)
        local = torch.zeros(nb, b, dtype=r.dtype, device=r.device).masked_fill(pad, float("-inf"))
        if nb * b > m:
            # log(1 - R·pad) by log1p, with R clamped below 1: where R_i,last reaches 1 (it does in
            # float32 after a few Sinkhorn iterations) log(0) = -inf and its gradient 1/0 is NaN
            share = r[..., -1:].clamp_max(1 - torch.finfo(r.dtype).eps) * pad[-1].to(r.dtype)  # [B, h, nb, b]
            slots = torch.log1p(-share)  # [B, h, nb, b]
        else:
            slots = torch.zeros_like(local)
        return torch.cat([local.expand_as(slots), slots], dim=-1).unsqueeze(-2)

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        q, k, v = self.split_heads(x)
        return self.merge_heads(self.sorted_attend(q, k, v, x[:, self.num_prefix:], grid))

    def reference(self, x: Tensor, grid: Grid) -> Tensor:
        q, k, v = self.split_heads(x)
        return self.merge_heads(self.sorted_reference(q, k, v, x[:, self.num_prefix:], grid))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        """The attention from q, k, v alone: ``sort_net: keys`` or ``bilinear`` (``input`` sorts on the layer input)."""
        self.check_qkv_only()
        return self.sorted_attend(q, k, v, None, grid)

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        """:meth:`sorted_reference` from q, k, v alone (``sort_net: keys`` or ``bilinear``)."""
        self.check_qkv_only()
        return self.sorted_reference(q, k, v, None, grid)

    def check_qkv_only(self) -> None:
        """``sort_net: input`` needs the layer input: a one-line ConfigError for a call without it."""
        check(self.cfg.sort_net != "input", "attention.sort_net=input sorts on the layer input x: call attn(x, grid)")

    def sorted_attend(self, q: Tensor, k: Tensor, v: Tensor, xg: Optional[Tensor], grid: Grid) -> Tensor:
        """Local plus sorted block attention ``[B, h, N, d]``.

        Args:
            q, k, v: ``[B, h, N, d]``.
            xg: the grid tokens of the layer input ``[B, M, C]`` (``sort_net: input``) or None.
            grid: the token grid.
        """
        P = self.num_prefix
        b, nb = self.layout(grid)
        (qp, qg), (kp, kg), (vp, vg) = self.split_prefix_qkv(q, k, v)
        m = qg.shape[-2]
        qb = pad_tokens(qg, nb * b).unflatten(-2, (nb, b))  # [B, h, nb, b, d]
        kv = pad_tokens(torch.cat([kg, vg], -1), nb * b).unflatten(-2, (nb, b))  # [B, h, nb, b, 2d] keys | values
        r = self.sort_matrix(xg, qb, kv[..., :kg.shape[-1]], m)  # [B, h, nb, nb]
        sorted_kv = (r @ kv.flatten(-2)).view_as(kv)  # [B, h, nb, b·2d] -> [B, h, nb, b, 2d] sorted blocks
        keys, values = torch.cat([kv, sorted_kv], -2).chunk(2, -1)  # [B, h, nb, 2b, d] each: own block, sorted block
        bias = self.block_bias(r, b, m)  # [B, h, nb, 1, 2b]
        # [B, h, nb, b, d], [B, h, nb, b]; the log-normaliser only where a prefix part is merged with it
        out, lse = attend_pieces(qb, keys, values, self.scale, bias, self.attn_drop, lse=P > 0)
        out = out.flatten(2, 3)[..., :m, :]  # [B, h, M, d]
        if not P:
            return out
        lse = lse.flatten(2)[..., :m]  # [B, h, M]
        out_p, lse_p = prefix_part(qg, kp, vp, self.scale, self.attn_drop)
        out_g = combine_parts(torch.stack([out, out_p], 2), torch.stack([lse, lse_p], 2), dim=2)  # [B, h, M, d]
        return self.prefix_rows(qp, k, v, out_g)

    def sorted_reference(self, q: Tensor, k: Tensor, v: Tensor, xg: Optional[Tensor], grid: Grid) -> Tensor:
        """Dense: sorted keys ``(R ⊗ I_b)K`` as extra slots, same-block mask, slot weights ``(R ⊗ I_b)·valid``.

        Args:
            q, k, v: ``[B, h, N, d]``.
            xg: the grid tokens of the layer input ``[B, M, C]`` (``sort_net: input``) or None.
            grid: the token grid.
        """
        P = self.num_prefix
        b, nb = self.layout(grid)
        (qp, qg), (kp, kg), (vp, vg) = self.split_prefix_qkv(q, k, v)
        m, length = qg.shape[-2], nb * b
        kpad, vpad = pad_tokens(kg, length), pad_tokens(vg, length)  # [B, h, L, d]
        r = self.sort_matrix(xg, pad_tokens(qg, length).unflatten(-2, (nb, b)), kpad.unflatten(-2, (nb, b)), m)
        perm = torch.kron(r, torch.eye(b, dtype=q.dtype))  # [B, h, L, L] token-level soft permutation
        valid = (torch.arange(length) < m).to(q.dtype)  # [L] real keys
        block = torch.arange(length) // b
        same = (block[:m, None] == block[None, :]).to(q.dtype)  # [M, L] query block == key (or slot) block
        w_local = (same * valid).expand(*r.shape[:2], -1, -1)  # [B, h, M, L]
        w_sorted = same * (perm @ valid).unsqueeze(-2)  # [B, h, M, L] slot weight Σ_j R_ij valid_j
        weight = torch.cat([w_local, w_sorted, w_local.new_ones(*w_local.shape[:-1], P)], dim=-1)  # [B, h, M, 2L + P]
        keys = torch.cat([kpad, perm @ kpad, kp], dim=-2)  # [B, h, 2L + P, d]
        values = torch.cat([vpad, perm @ vpad, vp], dim=-2)
        out = dense_parts((qg @ keys.transpose(-2, -1)) * self.scale, weight, values)  # [B, h, M, d]
        return self.dense_prefix_rows(qp, k, v, out)

    def attend_memory(self, grid: Grid, batch: int, amp: Optional[torch.dtype]) -> list[Saved]:
        """Shapes only (the soft permutation mixes whole blocks). The sorting network's inputs, its ReLU outputs
        and every Sinkhorn iterate with its log-sum-exp rows, then the block attention; in the projection's dtype
        under autocast, except after ``sort_net: keys``, whose fp32 bias makes the scores, R and the block bias fp32
        (then the matmuls keep autocast copies of R and of the block weights). The prefix keys and values go through
        batched matmuls that copy them unless the batch or the heads axis has length 1 (then the matmuls view the
        q|k|v storage)."""
        b, nb = self.layout(grid)
        B, h, d, C, size = batch, self.num_heads, self.head_dim, self.dim, itemsize(amp)
        sink = 4 if self.cfg.sort_net == "keys" else size  # bytes of the Sinkhorn iterates, R and the block bias
        N, M, P, L = self.seq_len(grid), grid[0] * grid[1], self.num_prefix, nb * b
        items = self.sort_net_memory(B, h, nb, b, amp)
        for _ in range(self.cfg.iters):  # a column then a row normalisation: logsumexp keeps input and result
            items += [Saved("Sinkhorn iterate", B * h * nb * nb, sink),  # [B, h, nb, nb]
                      Saved("Sinkhorn column log-sum-exp", B * h * nb, sink),  # [B, h, 1, nb]
                      Saved("Sinkhorn iterate", B * h * nb * nb, sink),  # [B, h, nb, nb]
                      Saved("Sinkhorn row log-sum-exp", B * h * nb, sink)]  # [B, h, nb, 1]
        if sink != size:  # the autocast copies the two matmuls read: R, and the fp32 block weights
            items += [Saved("soft permutation R (autocast copy)", B * h * nb * nb, size),  # [B, h, nb, nb]
                      Saved("block attention weights (autocast copy)", B * h * L * 2 * b, size)]  # [B, h, nb, b, 2b]
        items += [Saved("soft permutation R", B * h * nb * nb, sink),  # [B, h, nb, nb]: exp result, matmul input
                  Saved("key|value blocks", B * h * L * 2 * d, size),  # [B, h, nb, b, 2d]: R @ blocks input
                  Saved("own and sorted key|value blocks", B * h * L * 4 * d, size),  # [B, h, nb, 2b, 2d]
                  Saved("block queries (scaled)", B * h * L * d, size),  # [B, h, nb, b, d]
                  Saved("block attention weights", B * h * L * 2 * b, sink)]  # [B, h, nb, b, 2b]
        if L > M:  # the sorted slots' share of real keys: log1p keeps it, the pad mask scales it
            items += [Saved("sorted-slot pad mask", b, sink),  # [b] pad slots of the last block
                      Saved("sorted-slot pad share", B * h * nb * b, sink)]  # [B, h, nb, b]
        if not P:  # one image of one head: the output projection's input views the block output, pad rows included
            return items + ([Saved("pad rows under the proj input", B * (L - M) * C, size)] if B == h == 1 else [])
        items += [Saved("block scores", B * h * L * 2 * b, sink),  # [B, h, nb, b, 2b]: logsumexp input
                  Saved("block log-sum-exp", B * h * L, sink),  # [B, h, nb, b]
                  Saved("grid queries (scaled)", B * h * M * d, size),  # [B, h, M, d]: vs the prefix keys
                  Saved("prefix-key scores", B * h * M * P, size),  # [B, h, M, P]
                  Saved("prefix-key weights", B * h * M * P, size),  # [B, h, M, P]
                  Saved("prefix-key log-sum-exp", B * h * M, size),  # [B, h, M]
                  Saved("part weights", B * h * 2 * M, sink),  # [B, h, 2, M]: blocks and prefix part
                  Saved("part outputs", B * h * 2 * M * d, size),  # [B, h, 2, M, d]
                  Saved("prefix queries (scaled)", B * h * P * d, size),  # [B, h, P, d]
                  Saved("prefix-query weights", B * h * P * N, size)]  # [B, h, P, N]
        if B == 1 or h == 1:  # the matmuls view k and v in the projection's output
            return items + [Saved("q|k|v (projection output)", B * N * 3 * C, size)]  # [B, N, 3C]
        return items + [Saved("prefix keys (matmul copy)", B * h * d * P, size),  # [B·h, d, P]
                        Saved("prefix values (matmul copy)", B * h * P * d, size),  # [B·h, P, d]
                        Saved("keys (matmul copy)", B * h * d * N, size),  # [B·h, d, N]
                        Saved("values (matmul copy)", B * h * N * d, size)]  # [B·h, N, d]

    def sort_net_memory(self, B: int, h: int, nb: int, b: int, amp: Optional[torch.dtype]) -> list[Saved]:
        """What the sorting network keeps: its layers' inputs, ReLU outputs and weights' autocast or batch copies.

        Args:
            B: images; h: heads; nb: blocks; b: block size; amp: autocast dtype or ``None``.
        """
        C, d, s, size = self.dim, self.head_dim, self.cfg.sort_dim, itemsize(amp)
        if self.cfg.sort_net != "input":
            # a HeadLinear weight [h, d_in, d_out] expands over the batch: a copy, or for one image or one head a
            # view of the weight (of its autocast copy under amp; of the parameter itself, not counted, in fp32)
            copies = B if B > 1 and h > 1 else int(amp is not None)
            items = [Saved("real tokens per block", nb, 8)]  # [nb, 1] int64: the block means' divisor
            if self.cfg.sort_net == "keys":
                return items + [Saved("mean block keys", B * h * nb * d, size),  # [B, h, nb, d]
                                Saved("sort_hidden weight (batch copy)", copies * h * d * s, size),  # [B·h, d, s]
                                # [B, h, nb, s]: fp32, as the matmul's sum with the fp32 bias
                                Saved("sort-net hidden (ReLU)", B * h * nb * s, 4),
                                Saved("sort_out weight (batch copy)", copies * h * s * nb, size)] + (
                [Saved("sort_out input (autocast copy)", B * h * nb * s, size)] if amp is not None else [])
            return items + [Saved("mean block queries", B * h * nb * d, size),  # [B, h, nb, d]
                            Saved("mean block keys", B * h * nb * d, size),  # [B, h, nb, d]
                            Saved("sort_q weight (batch copy)", copies * h * d * s, size),  # [B·h, d, s]
                            Saved("sort_k weight (batch copy)", copies * h * d * s, size),  # [B·h, d, s]
                            Saved("block query embeddings", B * h * nb * s, size),  # [B, h, nb, s]
                            Saved("block key embeddings", B * h * nb * s, size)]  # [B, h, nb, s]
        items = [Saved("sort-net block sums of x", B * nb * C, size),  # [B, nb, C] (an autocast copy under amp)
                 Saved("sort-net hidden (ReLU)", B * nb * s, size),  # [B, nb, s]
                 Saved("sort-net logits (ReLU)", B * nb * h * nb, size)]  # [B, nb, h·nb]
        if amp is not None:
            items += [Saved("sort_hidden weight (autocast copy)", s * C, size),  # [s, C]
                      Saved("sort_out weight (autocast copy)", h * nb * s, size)]  # [h·nb, s]
        return items

    def attend_flops(self, grid: Grid) -> int:
        b, nb = self.layout(grid)
        d, h, s = self.head_dim, self.num_heads, self.cfg.sort_dim
        if self.cfg.sort_net == "bilinear":
            # each head's sort_q and sort_k maps on its block means (nb·d·s each), block-pair scores (nb·nb·s)
            flops = 2 * h * nb * d * s + h * nb * nb * s
        elif self.cfg.sort_net == "input":  # SortNet on the nb block sums: C -> s (nb·C·s), s -> h·nb (nb·s·h·nb)
            flops = nb * self.dim * s + nb * s * h * nb
        else:  # keys: pooled block -> s (nb·d·s), s -> nb logits (nb·s·nb), per head
            flops = h * nb * d * s + h * nb * s * nb
        # soft permutation R @ [K | V]: nb·nb·(b·2d) per head
        flops += 2 * h * nb * nb * b * d
        # per block: q kᵀ (b·2b·d) and attn v (b·2b·d) against local + sorted block, per head
        flops += h * attend_pieces_flops(nb, b, 2 * b, d)
        return flops + self.prefix_flops(grid)  # prefix keys of the grid queries, prefix queries

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        grid = grid or self.grid
        b, nb = self.layout(grid)  # L = nb·b: grid tokens padded to whole blocks
        return {**super().symbols(grid), "b": b, "nb": nb, "P": self.num_prefix, "M": grid[0] * grid[1],
                "L": nb * b, "s": self.cfg.sort_dim}
