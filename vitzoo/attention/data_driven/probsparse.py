"""Informer's ProbSparse self-attention (``probsparse``).

Paper: Zhou et al., "Informer: Beyond Efficient Transformer for Long Sequence Time-Series Forecasting",
AAAI 2021, https://arxiv.org/abs/2012.07436. Each query's sparsity is measured on U = min(c·⌈ln N⌉, N)
sampled keys by ``M(q) = max_j q·k_j − Σ_j q·k_j / N`` (the max-mean measurement, sum over the samples
divided by N as in the paper's code); the u = min(c·⌈ln N⌉, N) queries with the largest M attend to all
keys with softmax attention, every other query outputs the mean of V (the non-causal case). Cost
N log N. A global mixer: prefix tokens are ordinary tokens.

Sampled keys: U per query, drawn uniformly with replacement (a key may repeat) and shared by the batch and
the heads, as in the paper's code.

* Training: fresh draws for every training step. :meth:`ProbSparseAttention.before_train_step` (called by
  the training loop outside ``forward``) fills the ``draws`` buffer ``[N0, U0]`` (N0 tokens at construction)
  from a ``torch.Generator`` seeded by ``(run seed, layer index, step)``; the run seed is
  ``torch.initial_seed()`` when the layer is built (``pl.seed_everything`` sets it before a run builds its
  model). Seed, layer and step count are saved buffers and ``draws`` is redrawn from them on loading, so a
  resumed run continues the same stream and the same seed gives the same draws. A call with n <= N0 tokens
  (token reduction) uses ``draws[:n, :U] mod n``; more tokens than N0 in training is a ConfigError.
* Eval: key ``s`` of query ``i`` is the fixed pseudo-random index ``(i·A + s·B + layer·L) mod N``
  (:func:`sample_index`), so evaluation, compile and export are deterministic; with ``gcd(B, N) = 1`` the
  measurement runs as U shifted row products (:meth:`ProbSparseAttention.measure_band`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, QKVAttention, check, check_positive
from vitzoo.attention.functional import sdpa
from vitzoo.costs import Saved, itemsize
from vitzoo.ops.sdpa import fp32_backward_workspace

HASH_A, HASH_B, HASH_L = 2654435761, 40503, 97  # multipliers of the eval sample index (odd, spread over N)
RAW_HIGH = 1 << 62  # training draws are uniform in [0, 2^62); key = draw mod n (bias below n / 2^62)


def sample_count(factor: int, n: int) -> int:
    """``min(c·⌈ln n⌉, n)``: the number of sampled keys (and of selected queries) at length ``n``."""
    return min(factor * math.ceil(math.log(n)), n) if n > 1 else n


def sample_index(i: int, s: int, layer: int, n: int) -> int:
    """Eval: key sampled as the ``s``-th for query ``i`` of a length-``n`` sequence in layer ``layer``."""
    return (i * HASH_A + s * HASH_B + layer * HASH_L) % n


def step_generator(seed: int, layer: int, step: int) -> torch.Generator:
    """The CPU generator of one training step's draws in one layer (numpy's ``SeedSequence`` mixes the three
    numbers into one 64-bit seed).

    Args:
        seed: the run's seed (``torch.initial_seed()`` when the layer was built, set by ``pl.seed_everything``).
        layer: the layer index.
        step: the training step.
    """
    mixed = np.random.SeedSequence([seed, layer, step]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(mixed))


def _resync_draws(module: "ProbSparseAttention", incompatible_keys) -> None:
    """After ``load_state_dict``: the loaded seed, layer and step, and the draws of that step."""
    module._seed, module._layer, module._steps = int(module.draw_seed), int(module.sample_layer), int(module.steps)
    module.draws.copy_(module.draw(max(module._steps - 1, 0)))


@dataclass
class ProbSparseConfig:
    factor: int = 5  # c: U = u = c·⌈ln N⌉ sampled keys and selected queries (Informer's default 5)

    def __post_init__(self):
        check_positive(self, "factor")


@register_attention("probsparse", ProbSparseConfig)
class ProbSparseAttention(QKVAttention):
    """Top-u queries by the max-mean measurement attend to all keys, the rest output mean(V); cost :attr:`formula`.

    Args:
        cfg: ProbSparseConfig.
        ctx: dims, heads, grid, prefix tokens and layer index (it offsets the eval samples, a saved buffer, and
            seeds the training draws).
    """

    sequence_capable = True  # the output depends on the tokens as a sequence only
    formula = "4NC² + NUC + 2uNC"
    BAND_CHUNK = 1 << 16  # query and key values per image a band product reads at once (512 bands at h·d = 128)
    CHUNK = 1 << 13  # sampled key vectors per image gathered at once by the measurement (query chunks)

    def __init__(self, cfg: ProbSparseConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        # the layer's offset of the sampled keys: saved with the weights, so a loaded model samples the same keys
        self.register_buffer("sample_layer", torch.tensor(ctx.layer_index, dtype=torch.int64))
        # the run's seed when built and the training steps drawn for (saved); Python copies: no device sync
        self.register_buffer("draw_seed", torch.tensor(torch.initial_seed() % (1 << 63), dtype=torch.int64))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self._seed, self._layer, self._steps = int(self.draw_seed), ctx.layer_index, 0
        # training draws [N0, U0] of the current step (filled by before_train_step; rebuilt from the above on loading)
        self.register_buffer("draws", self.draw(0, self.seq_len()), persistent=False)
        self.register_load_state_dict_post_hook(_resync_draws)

    def draw(self, step: int, n0: Optional[int] = None) -> Tensor:
        """Raw draws ``[N0, U0]`` of training step ``step``: uniform in [0, 2^62), from :func:`step_generator`
        with the saved seed and layer index (CPU, int64).

        Args:
            step: training step.
            n0: rows N0 (default: those of the ``draws`` buffer, the construction length).
        """
        n0 = n0 or self.draws.shape[0]
        gen = step_generator(self._seed, self._layer, step)
        return torch.randint(RAW_HIGH, (n0, sample_count(self.cfg.factor, n0)), generator=gen)

    @torch.no_grad()
    def before_train_step(self) -> None:
        """Draw this training step's sampled keys into ``draws`` and count the step (eval mode: nothing)."""
        if not self.training:
            return
        self.draws.copy_(self.draw(self._steps))
        self._steps += 1
        self.steps.fill_(self._steps)

    def sample_keys(self, n: int, device: torch.device) -> Tensor:
        """Sampled key indices ``[n, U]`` of this call: the step's draws mod n in training, :meth:`samples` in eval.

        Args:
            n: sequence length.
            device: device of the indices (eval).
        """
        if not self.training:
            return self.samples(n, device)
        n0 = self.draws.shape[0]
        check(n <= n0, f"attention=probsparse draws its training samples for the {n0} tokens it was built for and "
                       f"got {n}; build the model at this size (model.img_size)")
        return self.draws[:n, :sample_count(self.cfg.factor, n)] % n  # [n, U]

    def samples(self, n: int, device: torch.device) -> Tensor:
        """Eval's sampled key indices ``[n, U]`` (:func:`sample_index` as tensor arithmetic)."""
        u = sample_count(self.cfg.factor, n)
        i = torch.arange(n, device=device)[:, None]
        s = torch.arange(u, device=device)[None, :]
        return (i * HASH_A + s * HASH_B + self.sample_layer * HASH_L) % n  # [n, U]

    def measure(self, q: Tensor, k: Tensor) -> Tensor:
        """The max-mean measurement ``[B, h, N]`` of every query on its sampled keys (no gradient: it only picks
        the active queries). Training: :meth:`measure_gather` on the step's draws. Eval: :meth:`measure_band`
        where the fixed samples form bands (``gcd(B, N) = 1`` for the sample multiplier B), else
        :meth:`measure_gather`; all compute the same N·U·d products.

        Args:
            q: queries ``[B, h, N, d]``.
            k: keys ``[B, h, N, d]``.
        """
        n = int(q.shape[2])
        if not self.training and math.gcd(HASH_B, n) == 1:
            return self.measure_band(q, k)
        return self.measure_gather(q, k, self.sample_keys(n, q.device))

    @torch.no_grad()
    def measure_band(self, q: Tensor, k: Tensor) -> Tensor:
        """The measurement as U shifted row products, without gathering ``[B, h, N, U, d]``.

        Key ``s`` of query ``i`` is ``(i·A + s·B + l·L) mod N = ((p_i + s)·B) mod N`` with
        ``p_i = (i·A + l·L)·B⁻¹ mod N``: in the key order ``p -> p·B mod N`` each query's U samples are the U
        keys from position ``p_i`` on, and ``i -> p_i`` is a permutation (A is a prime above any N). So the
        query whose band starts at p meets key ``p + s`` in the s-th product.

        Args:
            q: queries ``[B, h, N, d]``.
            k: keys ``[B, h, N, d]``.
        """
        N = int(q.shape[2])  # a Python int: the modular inverses below are computed once, at trace time
        U = sample_count(self.cfg.factor, N)
        pos = torch.arange(N, device=q.device)
        keys = k.index_select(2, pos * HASH_B % N)  # [B, h, N, d]: the key at order position p
        keys = torch.cat([keys, keys[:, :, :U - 1]], 2)  # [B, h, N + U - 1, d]: bands past the end wrap around
        first = (pos * HASH_B - self.sample_layer * HASH_L) % N * pow(HASH_A % N, -1, N) % N  # query of band p
        rows = q.index_select(2, first)  # [B, h, N, d]
        step = max(1, self.BAND_CHUNK // (q.shape[1] * q.shape[3]))  # bands per chunk: its rows and keys stay in cache
        parts = []
        for lo in range(0, N, step):
            n = min(step, N - lo)
            part = rows[:, :, lo:lo + n]  # [B, h, n, d]
            parts.append(torch.stack([torch.linalg.vecdot(part, keys[:, :, lo + s:lo + s + n]) for s in range(U)], -1))
        qk = torch.cat(parts, 2)  # [B, h, N, U]
        by_band = qk.amax(dim=-1) - qk.sum(dim=-1) / N  # [B, h, N]
        start = (pos * HASH_A + self.sample_layer * HASH_L) % N * pow(HASH_B, -1, N) % N  # [N] p_i
        return by_band.index_select(2, start)  # [B, h, N]

    @torch.no_grad()
    def measure_gather(self, q: Tensor, k: Tensor, idx: Tensor) -> Tensor:
        """The measurement from gathered samples, in query chunks of at most :attr:`CHUNK` sampled key vectors
        per image (not all ``[B, h, N, U, d]`` at once).

        Args:
            q: queries ``[B, h, N, d]``.
            k: keys ``[B, h, N, d]``.
            idx: sampled key indices ``[N, U]`` (:meth:`sample_keys`).
        """
        B, h, N, d = q.shape
        step = max(1, self.CHUNK // (h * idx.shape[1]))  # queries per chunk (batch-free: export keeps B dynamic)
        q, k = q.contiguous(), k.contiguous()
        parts = []
        for lo in range(0, N, step):
            part = idx[lo:lo + step]  # [n, U]
            k_sample = k.index_select(2, part.flatten()).view(B, h, *part.shape, d)  # [B, h, n, U, d]
            qk = torch.einsum("bhnd,bhnsd->bhns", q[:, :, lo:lo + step], k_sample)  # [B, h, n, U]
            parts.append(qk.amax(dim=-1) - qk.sum(dim=-1) / N)  # [B, h, n]
        return torch.cat(parts, dim=-1)  # [B, h, N]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        B, h, N, d = q.shape
        measure = self.measure(q, k)  # [B, h, N]: N·U·d per head
        top = measure.topk(sample_count(self.cfg.factor, N), dim=-1).indices  # [B, h, u]
        rows = top[..., None].expand(-1, -1, -1, d)  # [B, h, u, d]
        drop = self.attn_drop.p if self.training else 0.0
        active = sdpa(q.gather(2, rows), k, v, dropout_p=drop)  # [B, h, u, d]: 2·u·N·d
        # lazy queries: mean of V (a non-finite measurement, e.g. from a NaN query, stays non-finite)
        out = (v.mean(dim=2, keepdim=True) + measure[..., None] * 0).expand(B, h, N, d)
        return out.scatter(2, rows, active)  # [B, h, N, d]

    def attend_flops(self, grid: Grid) -> int:
        n = self.seq_len(grid)
        u = sample_count(self.cfg.factor, n)
        # sampled scores: N·U·d per head; the u active queries: u·N·d (scores) + u·N·d (weights · V) per head
        return n * u * self.dim + 2 * u * n * self.dim

    def attend_memory(self, grid: Grid, batch: int, amp: Optional[torch.dtype]) -> list[Saved]:
        """The measurement and the top-u pick run without gradient; the u active queries go through CPU's fused
        SDPA kernel (it keeps q, k, v, its output and the row log-sum-exp); the gather of the active queries and
        the scatter of their rows keep the top-u indices. The mean of V and the scatter keep no activation."""
        n, h, d, C, size = self.seq_len(grid), self.num_heads, self.head_dim, self.dim, itemsize(amp)
        u = sample_count(self.cfg.factor, n)
        workspace = fp32_backward_workspace(batch * h, u, n, d, amp=amp)  # the u active rows' fp32 backward
        return [Saved("q|k|v (projection output)", batch * n * 3 * C, size, workspace=workspace),  # [B, N, 3C]
                Saved("top-u query indices", batch * h * u, 8),  # [B, h, u] int64: gather and scatter index
                Saved("active queries", batch * h * u * d, size),  # [B, h, u, d] gathered q
                Saved("active attention output", batch * h * u * d, size),  # [B, h, u, d]
                Saved("active row log-sum-exp", batch * h * u, 4)]  # [B, h, u] fp32

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        """Per (image, head): the measurement from explicit samples, a sort, then full softmax rows."""
        B, h, N, d = q.shape
        U = sample_count(self.cfg.factor, N)
        if self.training:  # the step's draws, reduced mod N one by one
            cols = torch.tensor([[int(self.draws[i, s]) % N for s in range(U)] for i in range(N)])
        else:
            cols = torch.tensor([[sample_index(i, s, int(self.sample_layer), N) for s in range(U)] for i in range(N)])
        out = torch.empty_like(q)
        for b in range(B):
            for j in range(h):
                scores = q[b, j] @ k[b, j].T  # [N, N]
                picked = scores.gather(1, cols.to(q.device))  # [N, U]
                measure = picked.max(dim=1).values - picked.sum(dim=1) / N
                active = torch.argsort(measure, descending=True)[:U]
                # every query gets mean(V), the active ones are overwritten below; a non-finite measurement
                # (a NaN query) stays non-finite, as on the fast path
                out[b, j] = v[b, j].mean(dim=0) + measure[:, None] * 0
                w = (scores[active] * self.scale).softmax(dim=-1)
                out[b, j, active] = w @ v[b, j]
        return out

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        n = self.seq_len(grid)
        u = sample_count(self.cfg.factor, n)
        return {**super().symbols(grid), "U": u, "u": u}
