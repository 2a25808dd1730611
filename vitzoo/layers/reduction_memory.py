"""What a token reducer's own ops keep for backward in a training forward (``TokenReducer.memory``): the tensors
saved while the reducer runs, outside the block's modules it calls (norm1, the mixer's projections, norm2, the MLP
and the block itself have their own terms, as in :meth:`TokenReducer.parts`). Exact against
:class:`vitzoo.measure.activations.SavedTensorCounter` on CPU, fp32 and bf16 autocast.

``stream`` is the bytes per element of the residual stream the reducer receives (fp32: 4); ``amp`` the autocast
dtype. Where the reducer runs the mixer's attention itself (ToMe with keys, EViT: ``forward_with_keys`` of
``attention=global``), that attention's saved set is the reducer's: CPU's fused kernel keeps the q|k|v projection
output, its output and the row log-sum-exp (and ToMe's key bias).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from vitzoo.costs import Saved, itemsize
from vitzoo.layers.saved import drop_path_memory, layernorm_memory, mlp_memory, prefixed


def incoming_tokens(size: Any) -> int:
    """The token count n of a reducer's part size: ``(grid, n)`` as :meth:`TokenReducer.parts` gives it, or n."""
    return int(size[1]) if isinstance(size, tuple) else int(size)


def _attention(B: int, n: int, C: int, h: int, size: int) -> list[Saved]:
    """``attention=global`` run through ``forward_with_keys`` on n tokens (CPU's fused SDPA kernel)."""
    return [Saved("q|k|v (projection output)", B * n * 3 * C, size),  # [B, N, 3C]
            Saved("attention output", B * n * C, size),  # [B, h, N, d]
            Saved("row log-sum-exp", B * h * n, 4)]  # [B, h, N] fp32


def tome_memory(reducer: Any, n: int, B: int, amp: Optional[torch.dtype], stream: int) -> list[Saved]:
    """ToMe: the size-weighted attention (with keys) and the merge; the matching itself keeps nothing.

    Args:
        reducer: the :class:`~vitzoo.layers.token_reduction.ToMe`; n: incoming tokens; B: images;
        amp: autocast dtype or ``None``; stream: bytes per element of the residual stream.
    """
    (C, d), r = reducer.dims, reducer.merged(n)
    items = []
    if reducer.use_keys:  # key bias log s [B, 1, 1, N] in the scores' dtype
        items += [Saved("key bias log s", B * n, itemsize(amp) if amp is not None else stream)]
        items += _attention(B, n, C, C // d, itemsize(amp))
    if r > 0:
        na = (n + 1) // 2  # A tokens: the even positions
        items += [Saved("incoming token sizes", B * n, stream),  # [B, N, 1]: x·s keeps them
                  Saved("size-weighted tokens | sizes", B * n * (C + 1), stream),  # [B, N, C + 1]: gathers' input
                  Saved("A tokens by best edge", B * na, 8),  # [B, Na] int64: the merged ones' gather index
                  Saved("merge destinations", B * r, 8),  # [B, r] int64: scatter_add index
                  Saved("kept A tokens", B * (na - r), 8),  # [B, Na − r] int64: gather index
                  Saved("reciprocal merged sizes", B * (n - r), stream)]  # [B, N − r, 1]
    return items


def evit_memory(reducer: Any, n: int, B: int, amp: Optional[torch.dtype], stream: int,
                rate: Optional[float] = None) -> list[Saved]:
    """EViT: the attention, the class token's attention row, the gathers and the fused token.

    Args:
        reducer: the :class:`~vitzoo.layers.token_reduction.EViT`; n: incoming tokens; B: images;
        amp: autocast dtype or ``None``; stream: bytes per element of the residual stream;
        rate: keep rate (default: the training rate the schedule set, ``train_keep_rate``).
    """
    (C, d), size = reducer.dims, itemsize(amp)
    h, cast = C // d, size if amp is not None else stream
    k = reducer.kept(n, reducer.train_keep_rate if rate is None else rate)
    items = _attention(B, n, C, h, size) + [
        Saved("token order", B * (n - 1), 8),  # [B, N − 1] int64: gather index
        Saved("tokens after the mixer", B * n * C, stream)]  # [B, N, C]: the gathers' input
    if k < n - 1:  # the inattentive tokens fused into one, weighted by the class token's attention (with gradient)
        if B > 1 and h > 1:  # else the class query and the keys are views of the q|k|v storage
            items += [Saved("class query (matmul copy)", B * h * d, size),  # [B·h, 1, d]
                      Saved("keys (matmul copy)", B * h * d * n, size)]  # [B·h, d, N]
        items += [Saved("class-token attention", B * h * n, size),  # [B, h, 1, N] softmax result
                  Saved("mean class-token attention", B * n, size),  # [B, 1, N]: the scores' gather input
                  Saved("inattentive scores", B * (n - 1 - k), size),  # [B, N − 1 − k]
                  # [B, N − 1 − k, C]: the einsum's matmul keeps its autocast copy; over one token it multiplies
                  # elementwise (no autocast) and keeps the gathered tokens themselves
                  Saved("inattentive tokens", B * (n - 1 - k) * C, cast if n - 1 - k > 1 else stream)]
    return items


def tokenlearner_memory(reducer: Any, n: int, B: int, amp: Optional[torch.dtype], stream: int) -> list[Saved]:
    """TokenLearner: LayerNorm, the map MLP (C -> D -> S, GELU), the softmax maps and the pooling.

    Args:
        reducer: the :class:`~vitzoo.layers.token_reduction.TokenLearner`; n: incoming tokens; B: images;
        amp: autocast dtype or ``None``; stream: bytes per element of the residual stream.
    """
    C, D, S = reducer.norm.normalized_shape[0], reducer.mlp[0].out_features, reducer.num_tokens
    M, size = n - reducer.num_prefix, itemsize(amp)
    cast = size if amp is not None else stream
    items = [Saved("incoming tokens", B * n * C, stream),  # [B, N, C]: the grid tokens are a view of it
             Saved("norm row mean (fp32)", B * M, 4), Saved("norm row rstd (fp32)", B * M, 4),  # [B, M, 1] each
             Saved("mlp.0 input", B * M * C, cast),  # [B, M, C]: the norm's output (its autocast copy under amp)
             Saved("GELU input", B * M * D, size),  # [B, M, D]
             Saved("mlp.2 input", B * M * D, size),  # [B, M, D]: GELU's output
             Saved("maps", B * M * S, size)]  # [B, M, S]: softmax result, the pooling's input
    if amp is not None:
        items += [Saved("mlp.0 weight (autocast copy)", D * C, size),  # [D, C]
                  Saved("mlp.2 weight (autocast copy)", S * D, size)]  # [S, D]
        if stream != size:  # the pooling's autocast copy of the grid tokens
            items.append(Saved("grid tokens (autocast copy)", B * M * C, size))  # [B, M, C]
    return items


FORMULAS = {"tome": tome_memory, "evit": evit_memory, "tokenlearner": tokenlearner_memory}


def reducer_memory(reducer: Any, size: Any, batch: int = 1, amp: Optional[torch.dtype] = None,
                   stream: int = 4, **observed: Any) -> list[Saved]:
    """The formula of ``reducer``'s registered method on its part size.

    Args:
        reducer: a registered token reducer; size: ``(grid, n)`` or n incoming tokens; batch: images;
        amp: autocast dtype or ``None``; stream: bytes per element of the incoming stream;
        observed: method options (EViT's ``rate``).
    """
    formula = FORMULAS.get(reducer.registry_name)
    if formula is None:
        raise NotImplementedError(f"token reduction {reducer.registry_name} has no memory formula")
    return formula(reducer, incoming_tokens(size), batch, amp, stream, **observed)


def block_memory(reducer: Any, block: Any, grid: tuple[int, int], n: int, batch: int = 1,
                 amp: Optional[torch.dtype] = None, stream: int = 4) -> list[Saved]:
    """A block with its reduction, part by part as :meth:`TokenReducer.parts` lists them, each at its own token
    count: the norms, the mixer (whole, or its two projections where the reducer runs its attention), the reducer's
    own :func:`reducer_memory`, the MLP and the drop-path masks. TokenLearner's block runs whole on the learned
    tokens (:meth:`~vitzoo.layers.block.Block.plain_memory`).

    Args:
        reducer: the block's reducer; block: the block; grid: token grid; n: incoming tokens; batch: images;
        amp: autocast dtype or ``None``; stream: bytes per element of the residual stream.
    """
    C, size = block.attn.dim, itemsize(amp)
    # the mixer's output dtype, as in Block.plain_memory: the autocast one, or the input's for FFT mixers
    mixed = stream if getattr(block.attn, "keeps_input_dtype", False) else size
    if reducer.registry_name == "tokenlearner":  # the reducer, then the plain block on the P + S learned tokens
        learned = (1, reducer.reduced(n) - reducer.num_prefix)  # the sequence grid of the learned tokens
        return (prefixed("reducer", reducer_memory(reducer, (grid, n), batch, amp, stream))
                + block.plain_memory(learned, batch, amp, stream))
    items: list[Saved] = []
    for name, module, part in reducer.parts(block, grid, n):
        if name in ("norm1", "norm2"):
            items += prefixed(name, layernorm_memory(batch * part, C, stream))  # [B, N, C] and [B, N, 1] twice
        elif name == "attn":
            items += prefixed(name, module.memory(part, batch=batch, amp=amp))
        elif name == "attn.qkv":  # both projections (attn.proj follows): the attention itself is the reducer's
            items += prefixed("attn", block.attn.projection_memory(part, batch, amp))
        elif name == "reducer":
            items += prefixed(name, reducer_memory(reducer, part, batch, amp, stream))
            items += drop_path_memory("drop_path (mixer)", block.drop_path, batch, mixed)  # [B, 1, 1]
        elif name == "mlp":
            items += prefixed(name, mlp_memory(module, batch * part, amp))
    return items + drop_path_memory("drop_path (mlp)", block.drop_path, batch, size)  # [B, 1, 1]

