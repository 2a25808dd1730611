"""Token reduction inside a ViT (``model.token_reduction``): fewer tokens in the later blocks.

Papers: Bolya et al., "Token Merging: Your ViT but Faster", ICLR 2023, https://arxiv.org/abs/2210.09461
(``tome``); Liang et al., "Not All Patches are What You Need: Expediting Vision Transformers via Token
Reorganizations", ICLR 2022, https://arxiv.org/abs/2202.07800 (``evit``); Ryoo et al., "TokenLearner: What
Can 8 Learned Tokens Do for Images and Videos?", NeurIPS 2021, https://arxiv.org/abs/2106.11297
(``tokenlearner``).

* ``tome``: in every block, after the mixer and before the MLP, bipartite soft matching merges r tokens:
  tokens alternate between sets A and B, each A token's most similar B token (cosine similarity of the
  keys averaged over heads) is its edge, the r best edges merge their A token into the B token (a
  size-weighted mean). Each token carries its size s (patches merged into it); with ``attention=global``
  attention is size-weighted, ``softmax(QKᵀ/√d + log s)``, as in the paper. With another sequence backend
  the similarity is measured on the mixer's input (no keys are exposed) and attention is unweighted.
* ``evit``: at the chosen blocks, after the mixer, the class token's attention (averaged over heads) ranks
  the other tokens; the top ``⌈keep_rate·(N − 1)⌉`` stay and the rest are fused into one token, their
  sum weighted by that attention. Needs ``attention=global`` and a class token. In training the keep rate
  warms up from 1 to ``keep_rate`` (:meth:`EViTConfig.rate_at`, set before every step by
  :func:`set_training_progress`); evaluation, export and the FLOPs (:meth:`TokenReducer.block_flops`) use
  ``keep_rate``: a training step in the warm-up runs more tokens than the FLOPs count.
* ``tokenlearner``: before the chosen block, S learned spatial-attention maps (LayerNorm, an MLP with a
  D-wide hidden layer, softmax over the grid tokens) pool the grid tokens into S tokens; prefix tokens stay.

No reducer makes the sequence longer: ToMe merges at most half the tokens, EViT keeps a fraction in (0, 1]
plus one fused token only when it drops two or more, and TokenLearner's S is refused above the grid's
token count.

After a reduction the tokens are a sequence, not a grid: the blocks call their mixer with the grid
``(1, N − P)``, so only backends that see tokens as a sequence take part (:func:`sequence_backends`);
any other is a build-time error naming both options. Every block's analytic FLOPs follow its token
count (:meth:`TokenReducer.block_flops`), equal to fvcore's per block.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Optional

import torch
from torch import Tensor, nn

from vitzoo.attention import ATTENTION, attention_class, attention_config
from vitzoo.attention.base import Grid, check
from vitzoo.costs import Saved, layernorm_flops
from vitzoo.layers.reduction_memory import block_memory, reducer_memory
from vitzoo.layers.reduction_options import EViTConfig, TokenLearnerConfig, ToMeConfig, check_no_growth
from vitzoo.registry import Registry

REDUCTIONS = Registry("model.token_reduction")


def sequence_backends() -> list[str]:
    """The backends whose output depends on the tokens as a sequence only (not on a grid, windows, or a fixed
    length): those whose class declares :attr:`~vitzoo.attention.base.TokenMixer.sequence_capable`."""
    return [n for n in ATTENTION.names() if ATTENTION.get(n)[0].sequence_capable]


def reduction_config(spec: Any) -> Any:
    """``None``/``"none"`` -> None; ``"tome"`` or ``{"name": "tome", "r": 13}`` -> the method's config."""
    if spec is None or spec == "none" or (isinstance(spec, Mapping) and spec.get("name") in (None, "none")):
        return None
    return REDUCTIONS.config(spec)


def check_backend(spec: Any, attention: Any, class_token: bool) -> None:
    """A build-time ConfigError, naming both options, where ``attention`` cannot run on a reduced sequence."""
    cfg = reduction_config(spec)
    name = REDUCTIONS.name_of(cfg)
    att = ATTENTION.name_of(attention_config(attention))
    opt = f"model.token_reduction={name}"
    cls, acfg = attention_class(attention), attention_config(attention)
    check(not cls.sequence_capable or cls.takes_sequence(acfg),
          f"{opt} cannot run with attention={att} as configured: {cls.takes_sequence.__doc__.strip()}")
    check(cls.sequence_capable, f"{opt} cannot run with attention={att}: it needs the full token grid (windows, "
                                f"local patterns or a fixed length); use a sequence backend "
                                f"({', '.join(sequence_backends())})")
    if name == "evit":
        check(cls.exposes_attention, f"{opt} ranks tokens by the class token's softmax attention, which needs a "
                                     f"backend that exposes its queries and keys: use attention=global "
                                     f"(got attention={att})")
        check(class_token, f"{opt} needs model.class_token=true")


def attach_reducers(spec: Any, attention: Any, blocks: nn.ModuleList, num_prefix: int) -> None:
    """Set ``block.reducer`` of each block that reduces tokens.

    Args:
        spec: ``model.token_reduction``; attention: the blocks' attention spec; blocks: the model's blocks;
        num_prefix: prefix tokens P.
    """
    cfg = reduction_config(spec)
    cls = REDUCTIONS.get(REDUCTIONS.name_of(cfg))[0]
    dim, head_dim = blocks[0].attn.dim, blocks[0].attn.head_dim
    exposes = attention_class(attention).exposes_attention  # the reducer reads the mixer's keys and weights its scores
    check_no_growth(cfg, math.prod(blocks[0].attn.grid))
    for i, reducer in cls.for_blocks(cfg, len(blocks), num_prefix, dim, exposes).items():
        reducer.dims = (dim, head_dim)  # (C, d) of the host block's mixer
        blocks[i].reducer = reducer


def set_training_progress(model: nn.Module, epoch: float) -> None:
    """Move every reducer's training schedule (EViT's keep rate) in ``model`` to ``epoch`` epochs of training.

    Called before every training step, outside ``forward`` (the training module's
    :class:`~vitzoo.training.token_schedule.TokenReductionSchedule` does it from the global step).

    Args:
        model: a network (reducers anywhere inside it); epoch: epochs done before the step (fractional).
    """
    for module in model.modules():
        if isinstance(module, TokenReducer):
            module.set_progress(epoch)


def sequence_grid(n: int, num_prefix: int) -> Grid:
    """The grid a mixer is called with on a reduced sequence of ``n`` tokens: ``(1, n − P)``."""
    return 1, n - num_prefix


class TokenReducer(nn.Module):
    """Runs one block with a reduction: ``forward(block, x, grid, size) -> (x, grid, size)``.

    ``size[B, N, 1]`` counts the patches each token stands for (ones before any merge).
    """

    num_prefix: int

    def forward(self, block: nn.Module, x: Tensor, grid: Grid, size: Tensor) -> tuple[Tensor, Grid, Tensor]:
        raise NotImplementedError  # pragma: no cover

    def reduced(self, n: int) -> int:
        """Tokens after the block, from ``n`` before it."""
        raise NotImplementedError  # pragma: no cover

    def set_progress(self, epoch: float) -> None:
        """Per-step training state (default: none).

        Args:
            epoch: epochs of training done before the step (fractional).
        """

    def parts(self, block: nn.Module, grid: Grid, n: int) -> list[tuple[str, nn.Module, Any]]:
        """``(name, module, size)`` of what the block runs on ``n`` tokens (at ``grid``), in the order it
        runs them; the reducer itself is the part ``"reducer"`` with size ``(grid, n)``."""
        raise NotImplementedError  # pragma: no cover

    def flops(self, size: tuple[Grid, int]) -> int:
        """MACs of the ops the reducer runs itself (not those of the block's modules it calls)."""
        raise NotImplementedError  # pragma: no cover

    def memory(self, size: Any, batch: int = 1, amp: Optional[torch.dtype] = None, stream: int = 4,
               **observed: Any) -> list[Saved]:
        """What the reducer's own ops keep for backward in a training forward (not the block's modules it calls):
        :func:`vitzoo.layers.reduction_memory.reducer_memory` (``size``: ``(grid, n)`` as in :meth:`parts`, or n)."""
        return reducer_memory(self, size, batch, amp, stream, **observed)

    def block_memory(self, block: nn.Module, grid: Grid, n: int, batch: int = 1, amp: Optional[torch.dtype] = None,
                     stream: int = 4) -> list[Saved]:
        """The block with this reduction: :func:`vitzoo.layers.reduction_memory.block_memory` (same arguments)."""
        return block_memory(self, block, grid, n, batch, amp, stream)

    def block_flops(self, block: nn.Module, grid: Grid, n: int) -> int:
        """MACs of the block on ``n`` tokens (at ``grid`` while no token has been reduced): its parts' sum."""
        return sum(_part_flops(module, size) for _, module, size in self.parts(block, grid, n))


def _part_flops(module: nn.Module, size: Any) -> int:
    """A part's MACs: its own ``flops(size)``, or a linear / norm / MLP on ``size`` tokens."""
    if hasattr(module, "flops"):
        return module.flops(size)
    if isinstance(module, nn.Linear):
        return size * module.in_features * module.out_features
    if isinstance(module, nn.LayerNorm):
        return layernorm_flops(size * module.normalized_shape[0])
    return _mlp_flops(module, size)


def _head_parts(block: nn.Module, grid: Grid, n: int, with_keys: bool) -> list[tuple[str, nn.Module, Any]]:
    """norm1, then the mixer: whole, or (run by the reducer through ``forward_with_keys``, whose attention the
    reducer's row counts) only its two projections."""
    if not with_keys:
        return [("norm1", block.norm1, n), ("attn", block.attn, grid)]
    return [("norm1", block.norm1, n), ("attn.qkv", block.attn.qkv, n), ("attn.proj", block.attn.proj, n)]


def _tail_parts(block: nn.Module, n: int) -> list[tuple[str, nn.Module, Any]]:
    return [("norm2", block.norm2, n), ("mlp", block.mlp, n)]


def _mlp_flops(mlp: nn.Module, n: int) -> int:
    """fc1 + fc2 of an MLP on n tokens."""
    fc1, fc2 = mlp.fc1, mlp.fc2
    return n * (fc1.in_features * fc1.out_features + fc2.in_features * fc2.out_features)


def size_bias(size: Tensor) -> Tensor:
    """ToMe's proportional attention term ``log s_j`` as a key bias ``[B, 1, 1, N]`` (sizes ``[B, N, 1]``)."""
    return size.log()[:, None, None, :, 0]


def _finish(block: nn.Module, x: Tensor) -> Tensor:
    return x + block.drop_path(block.mlp(block.norm2(x)))


@REDUCTIONS.register("tome", ToMeConfig)
class ToMe(TokenReducer):
    """Bipartite soft matching after the mixer of every block (see the module docstring).

    Args:
        cfg: ToMeConfig; num_prefix: prefix tokens (at most 1, kept unmerged); use_keys: the block's mixer
        exposes its attention (keys as the similarity, size-weighted attention).
    """

    formula = "2N²C (global) + ⌈N/2⌉·⌊N/2⌋·c"  # the reducer's own ops (the block's modules it calls have their rows)

    def __init__(self, cfg: ToMeConfig, num_prefix: int, use_keys: bool):
        super().__init__()
        self.r, self.num_prefix, self.use_keys = cfg.r, num_prefix, use_keys
        self.dims = (0, 0)  # (C, d) of the host block's mixer, set by attach_reducers

    @classmethod
    def for_blocks(cls, cfg: ToMeConfig, depth: int, num_prefix: int, dim: int, exposes: bool):
        check(num_prefix <= 1, f"model.token_reduction=tome keeps one class token unmerged (got {num_prefix})")
        return {i: cls(cfg, num_prefix, exposes) for i in range(depth)}

    def merged(self, n: int) -> int:
        return min(self.r, (n - self.num_prefix) // 2)

    def reduced(self, n: int) -> int:
        return n - self.merged(n)

    def forward(self, block, x, grid, size):
        h = block.norm1(x)
        if self.use_keys:
            out, _, k = block.attn.forward_with_keys(h, grid, size_bias(size))
            metric = k.mean(dim=1)  # [B, N, d]
        else:
            out, metric = block.attn(h, grid), h  # [B, N, C]
        x = x + block.drop_path(out)
        r = self.merged(x.shape[1])
        if r > 0:
            x, size = self.merge(x, size, metric, r)
        return _finish(block, x), sequence_grid(x.shape[1], self.num_prefix), size

    def merge(self, x: Tensor, size: Tensor, metric: Tensor, r: int) -> tuple[Tensor, Tensor]:
        """Merge the r best A→B edges: sizes add, features are size-weighted means."""
        with torch.no_grad():  # the matching is a decision: autograd keeps nothing of it
            metric = metric / metric.norm(dim=-1, keepdim=True)
            a, b = metric[:, ::2], metric[:, 1::2]  # A: even positions (the class token is 0), B: odd
            scores = a @ b.transpose(-2, -1)  # [B, Na, Nb]: Na·Nb·c
            if self.num_prefix:
                scores = torch.cat([torch.full_like(scores[:, :1], -math.inf), scores[:, 1:]], dim=1)  # never merge it
            best, dst_of = scores.max(dim=-1)  # [B, Na]
            order = best.argsort(dim=-1, descending=True)
            src, keep = order[:, :r], order[:, r:].sort(dim=-1).values  # kept A tokens in order (class token first)
            dst = dst_of.gather(1, src)  # [B, r]
        xs = torch.cat([x * size, size], dim=-1)  # [B, N, C + 1]: weighted features and sizes merge together
        xa, xb = xs[:, ::2], xs[:, 1::2]
        c = xs.shape[-1]
        moved = xa.gather(1, src[..., None].expand(-1, -1, c))  # [B, r, C + 1]
        xb = xb.scatter_add(1, dst[..., None].expand(-1, -1, c), moved)
        xs = torch.cat([xa.gather(1, keep[..., None].expand(-1, -1, c)), xb], dim=1)  # [B, N − r, C + 1]
        # sizes are counts without gradient, in a storage of their own: the next merge keeps them, not all of xs
        size = xs[..., -1:].detach().contiguous()  # [B, N − r, 1]
        return xs[..., :-1] * size.reciprocal(), size

    def parts(self, block, grid, n):
        return [*_head_parts(block, grid, n, self.use_keys), ("reducer", self, (grid, n)),
                *_tail_parts(block, self.reduced(n))]

    def flops(self, size):
        (_, n), (C, d) = size, self.dims
        attention = 2 * n * n * C if self.use_keys else 0  # size-weighted QKᵀ and AV: N·N·d per head each
        merge = ((n + 1) // 2) * (n // 2) * (d if self.use_keys else C) if self.merged(n) > 0 else 0  # A·Bᵀ
        return attention + merge


@REDUCTIONS.register("evit", EViTConfig)
class EViT(TokenReducer):
    """Keep the top-k tokens by class-token attention, fuse the rest into one (see the module docstring).

    Args:
        cfg: EViTConfig; num_prefix: 1 (the class token).
    """

    formula = "2N²C + NC + (N − 1 − k)C"  # the reducer's own ops (the block's modules it calls have their rows)

    def __init__(self, cfg: EViTConfig, num_prefix: int):
        super().__init__()
        self.schedule, self.num_prefix = cfg, num_prefix
        self.keep_rate = float(cfg.keep_rate)  # the target: evaluation, export, reported FLOPs
        self.train_keep_rate = self.keep_rate  # in training: the schedule's rate, set by set_progress before a step
        self.dims = (0, 0)  # (C, d) of the host block's mixer, set by attach_reducers

    @property
    def rate(self) -> float:
        """The keep rate this module runs at: the scheduled one in training, the target in evaluation."""
        return self.train_keep_rate if self.training else self.keep_rate

    def set_progress(self, epoch: float) -> None:
        self.train_keep_rate = self.schedule.rate_at(epoch)

    @classmethod
    def for_blocks(cls, cfg: EViTConfig, depth: int, num_prefix: int, dim: int, exposes: bool):
        locations = range(3, depth, 3) if cfg.locations is None else cfg.locations
        check(all(i < depth for i in locations),
              f"model.token_reduction.locations must be blocks of the model (< model.depth={depth}, got "
              f"{list(locations)})")
        return {i: cls(cfg, num_prefix) for i in locations}

    def kept(self, n: int, rate: Optional[float] = None) -> int:
        """Non-class tokens kept of ``n`` tokens at ``rate`` (None: the target ``keep_rate``, which FLOPs count)."""
        return math.ceil((self.keep_rate if rate is None else rate) * (n - 1))

    def reduced(self, n: int) -> int:
        k = self.kept(n)
        return 1 + k + (k < n - 1)

    def forward(self, block, x, grid, size):
        out, q, k = block.attn.forward_with_keys(block.norm1(x), grid)
        x = x + block.drop_path(out)
        n, keep = x.shape[1], self.kept(x.shape[1], self.rate)
        with torch.set_grad_enabled(torch.is_grad_enabled() and keep < n - 1):  # its gradient: the fused token's
            cls_attn = ((q[:, :, :1] @ k.transpose(-2, -1)) * block.attn.scale).softmax(dim=-1)  # [B, h, 1, N]: N·d
        score = cls_attn.mean(dim=1)[:, 0, 1:]  # [B, N − 1]
        order = score.detach().argsort(dim=-1, descending=True)  # a decision: autograd keeps nothing of it
        top, rest = order[:, :keep], order[:, keep:]
        tokens = x[:, 1:]
        c = x.shape[-1]
        parts = [x[:, :1], tokens.gather(1, top[..., None].expand(-1, -1, c))]
        if keep < n - 1:
            others = tokens.gather(1, rest[..., None].expand(-1, -1, c))  # [B, N − 1 − k, C]
            fused = torch.einsum("bn,bnc->bc", score.gather(1, rest), others)  # (N − 1 − k)·C
            parts.append(fused[:, None])  # [B, 1, C]: attention-weighted sum of the inattentive tokens
        x = torch.cat(parts, dim=1)
        return _finish(block, x), sequence_grid(x.shape[1], 1), size

    def parts(self, block, grid, n):
        return [*_head_parts(block, grid, n, True), ("reducer", self, (grid, n)), *_tail_parts(block, self.reduced(n))]

    def flops(self, size):
        (_, n), C = size, self.dims[0]
        # QKᵀ and AV (N·N·d per head each), the class token's attention row (N·d per head), the fused token
        return 2 * n * n * C + n * C + (n - 1 - self.kept(n)) * C


@REDUCTIONS.register("tokenlearner", TokenLearnerConfig)
class TokenLearner(TokenReducer):
    """S learned spatial-attention maps pool the grid tokens into S tokens before the block.

    Args:
        cfg: TokenLearnerConfig; num_prefix: prefix tokens (kept); dim: channels C.
    """

    formula = "5MC + MCD + MDS + MSC"  # the reducer's own ops (the block's modules it calls have their rows)

    def __init__(self, cfg: TokenLearnerConfig, num_prefix: int, dim: int):
        super().__init__()
        self.num_tokens, self.num_prefix = cfg.num_tokens, num_prefix
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, cfg.hidden_dim), nn.GELU(), nn.Linear(cfg.hidden_dim, cfg.num_tokens))

    @classmethod
    def for_blocks(cls, cfg: TokenLearnerConfig, depth: int, num_prefix: int, dim: int, exposes: bool):
        location = depth // 2 if cfg.location is None else cfg.location
        check(location < depth, f"model.token_reduction.location must be a block of the model "
                                f"(< model.depth={depth}, got {location})")
        return {location: cls(cfg, num_prefix, dim)}

    def reduced(self, n: int) -> int:
        return self.num_prefix + self.num_tokens

    def forward(self, block, x, grid, size):
        P = self.num_prefix
        tokens = x[:, P:]  # [B, M, C]
        if tokens.shape[1] < self.num_tokens:  # an image smaller than the model's: more maps than grid tokens
            check(False, f"model.token_reduction.num_tokens must be at most the grid's {tokens.shape[1]} tokens "
                         f"(got {self.num_tokens})")
        maps = self.mlp(self.norm(tokens)).softmax(dim=1)  # [B, M, S]: each map sums to 1 over the tokens
        learned = torch.einsum("bms,bmc->bsc", maps, tokens)  # [B, S, C]: S·M·C
        x = torch.cat([x[:, :P], learned], dim=1)
        grid = sequence_grid(x.shape[1], P)
        return block(x, grid), grid, size  # Block.forward runs the block itself (its reducer is called by the model)

    def parts(self, block, grid, n):
        return [("reducer", self, (grid, n)), *block.plain_parts(sequence_grid(self.reduced(n), self.num_prefix))]

    def flops(self, size):
        (_, n), C, S, D = size, self.norm.normalized_shape[0], self.num_tokens, self.mlp[0].out_features
        M = n - self.num_prefix
        return layernorm_flops(M * C) + M * C * D + M * D * S + S * M * C  # norm, MLP (C -> D -> S), pooling


__all__ = ["REDUCTIONS", "TokenReducer", "attach_reducers", "check_backend", "sequence_backends",
           "reduction_config", "sequence_grid", "set_training_progress"]
