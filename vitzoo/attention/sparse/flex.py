"""FlexAttention path of the fixed sparse-pattern backends (``attention.impl``).

Paper: Dong et al., "Flex Attention: A Programming Model for Generating Optimized Attention
Kernels", arXiv 2024, https://arxiv.org/abs/2412.05496 (``torch.nn.attention.flex_attention``).

``attention.impl`` of ``local``, ``dilated``, ``global_tokens``, ``longformer``, ``bigbird`` and
``multi_pattern`` picks how the pattern runs:

* ``blocked``: the halo / gathered path of :mod:`vitzoo.attention.sparse.pattern` (any device, training);
* ``flex``: one ``flex_attention`` call over the real tokens with a ``BlockMask``. Queries are the
  ``P + L`` tokens in order, keys ``[prefix P, learned g, grid L]`` (the layout of
  :meth:`~vitzoo.attention.sparse.pattern.SparsePatternAttention.full_mask`): ``mask_mod`` says "visible"
  for prefix queries and for prefix and learned keys, and asks the backend's small lookup tables
  for grid pairs (per-axis ``[h, H, H]``/``[h, W, W]`` tables of neighbourhoods, per-head block
  tables ``[h, n_b, n_b]`` of BigBird). No dense N×N tensor is built on the forward path; the
  ``BlockMask`` is built once per (grid, device) and cached (on CUDA by a compiled kernel, block
  by block; eager on CPU evaluates ``mask_mod`` over all ``[h, Nq, Nk]`` pairs that one time).
  ``local``'s relative position bias is a ``score_mod`` reading the learned table through per-axis offset tables;
* ``auto`` (default): ``flex`` on CUDA, ``blocked`` elsewhere; also ``blocked`` while training
  with attention dropout, which FlexAttention does not have.

The choice for one call is ``sparse_pattern`` in :mod:`vitzoo.ops.dispatch`.

Limits: FlexAttention has no attention-weight dropout, and in torch 2.14 no backward on CPU.
``impl: flex`` in those cases is a one-line :class:`~vitzoo.registry.ConfigError` naming
``attention.impl`` (no silent fallback). Without ``torch.compile`` (CPU here) flex_attention runs
an unfused reference that materialises the scores: it is for checking outputs, not for speed. On
CUDA the kernel is compiled with ``torch.compile`` on first use (tests run that compiled kernel
on CPU, through inductor, against the blocked path). FlexAttention skips fully masked 128×128
blocks but computes partially masked blocks densely, so its work lies between the analytic count
of the pattern (what ``flops()`` reports, for every ``impl``) and dense attention.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from vitzoo.attention.base import Grid, check
from vitzoo.attention.sparse.geometry import Neighbourhood, axis_mask
from vitzoo.ops.dispatch import IMPLS

GridMod = Callable[[Tensor, Tensor, Tensor], Tensor]  # (head, grid query, grid key) -> bool or additive score

_CACHE: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()  # module -> {(grid, device): ...}
_COMPILED: Optional[Callable] = None


def check_impl(cfg: Any) -> None:
    """Config check of ``attention.impl`` (one of :data:`IMPLS`)."""
    check(cfg.impl in IMPLS, f"attention.impl must be one of {', '.join(IMPLS)} (got {cfg.impl!r})")


def axis_tables_mod(rows: Tensor, cols: Tensor, width: int) -> GridMod:
    """Neighbourhood membership of grid pairs from per-axis tables.

    Args:
        rows: ``[h, H, H]`` booleans (query row may see key row) per head.
        cols: ``[h, W, W]`` booleans (query column may see key column) per head.
        width: W (raster id = row·W + column).
    """
    def grid_mod(h: Tensor, qi: Tensor, ki: Tensor) -> Tensor:
        return rows[h, qi // width, ki // width] & cols[h, qi % width, ki % width]
    return grid_mod


def neighbourhood_tables(patterns: list[tuple[int, Optional[Neighbourhood]]], grid: Grid) -> tuple[Tensor, Tensor]:
    """Per-head axis tables ``rows[h, H, H]``, ``cols[h, W, W]`` of neighbourhood head groups.

    Args:
        patterns: ``[(heads, Neighbourhood or None), ...]`` in head order (None: dense heads).
        grid: (H, W).
    """
    (H, W), rows, cols = grid, [], []
    for heads, nbhd in patterns:
        if not heads:
            continue
        if nbhd is None:  # dense heads: every row and column
            r, c = torch.ones(H, H, dtype=torch.bool), torch.ones(W, W, dtype=torch.bool)
        else:
            dh, dw = nbhd.dilations(grid)
            r, c = axis_mask(H, nbhd.kernel, dh, nbhd.border), axis_mask(W, nbhd.kernel, dw, nbhd.border)
        rows.append(r.expand(heads, H, H))
        cols.append(c.expand(heads, W, W))
    return torch.cat(rows), torch.cat(cols)  # [h, H, H], [h, W, W]


def block_tables_mod(allowed: Tensor, block_of: Tensor) -> GridMod:
    """Block-sparse membership of grid pairs.

    Args:
        allowed: ``[h, n_b, n_b]`` booleans (query block may see key block) per head.
        block_of: ``[L]`` block id of each grid token (raster order).
    """
    def grid_mod(h: Tensor, qi: Tensor, ki: Tensor) -> Tensor:
        return allowed[h, block_of[qi], block_of[ki]]
    return grid_mod


def pattern_mask_mod(grid_mod: GridMod, num_prefix: int, num_learned: int, num_grid: int,
                     prefix_rows: Optional[int] = None) -> Callable:
    """``mask_mod(b, h, q_idx, kv_idx)`` of the whole pattern: queries ``[P + L]``, keys ``[P + g + L]``.

    Prefix queries and prefix/learned keys are global; grid pairs ask ``grid_mod``.

    Args:
        grid_mod: the backend's grid-pair membership (see :func:`axis_tables_mod`).
        num_prefix: P.
        num_learned: learned global tokens g.
        num_grid: L = H·W.
        prefix_rows: query rows in front of the grid's; None: P. 0: the queries are the L grid tokens only
            (``longformer``'s prefix rows with their own projection run apart).
    """
    P, G, L = num_prefix if prefix_rows is None else prefix_rows, num_prefix + num_learned, num_grid

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        qi, ki = (q_idx - P).clamp(0, L - 1), (kv_idx - G).clamp(0, L - 1)  # grid ids (clamped off the grid)
        return (q_idx < P) | (kv_idx < G) | grid_mod(h, qi, ki)
    return mask_mod


def pattern_score_mod(grid_bias: GridMod, num_prefix: int, num_learned: int, num_grid: int,
                      prefix_rows: Optional[int] = None) -> Callable:
    """``score_mod(score, b, h, q_idx, kv_idx)`` adding ``grid_bias`` to grid-query/grid-key scores only.

    Args:
        grid_bias: the backend's additive score of a grid pair (``local``'s relative position bias).
        num_prefix: P.
        num_learned: g.
        num_grid: L.
        prefix_rows: query rows in front of the grid's (as in :func:`pattern_mask_mod`).
    """
    P, G, L = num_prefix if prefix_rows is None else prefix_rows, num_prefix + num_learned, num_grid

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        qi, ki = (q_idx - P).clamp(0, L - 1), (kv_idx - G).clamp(0, L - 1)
        on_grid = (q_idx >= P) & (kv_idx >= G)
        return torch.where(on_grid, score + grid_bias(h, qi, ki).to(score.dtype), score)
    return score_mod


def flex_mask_at(module: nn.Module, grid: tuple, device: Any, build: Callable) -> tuple[BlockMask, Optional[Callable]]:
    """The cached ``(BlockMask, score_mod)`` of ``module`` at ``(grid, device)``; ``build()`` makes them once.

    Kept outside the module (a weak dictionary) so that pickling or copying a module never meets
    the closures; :func:`forget` drops a module's entries when its pattern changes.
    """
    entries = _CACHE.setdefault(module, {})
    key = (tuple(grid), str(torch.device(device)))
    if key not in entries:
        entries[key] = build()
    return entries[key]


def forget(module: nn.Module) -> None:
    """Drop the cached block masks of ``module`` (its pattern was rebuilt, e.g. BigBird's loaded draw)."""
    _CACHE.pop(module, None)


def block_mask(mask_mod: Callable, heads: int, q_len: int, kv_len: int, device: Any) -> BlockMask:
    """``create_block_mask`` over ``heads`` heads (broadcast over the batch), ``q_len`` × ``kv_len`` tokens.

    On CUDA the mask is built by a compiled kernel block by block (``_compile``), never as a dense
    ``[h, Nq, Nk]`` tensor; eager (CPU, the forward-only check) evaluates every pair once."""
    device = torch.device(device)
    return create_block_mask(mask_mod, None, heads, q_len, kv_len, device=str(device), _compile=device.type == "cuda")


def compiled_flex() -> Callable:
    """``torch.compile(flex_attention)``, compiled once per process (the fused kernel; inductor)."""
    global _COMPILED
    if _COMPILED is None:
        _COMPILED = torch.compile(flex_attention, dynamic=False)
    return _COMPILED


def run_flex(q: Tensor, k: Tensor, v: Tensor, mask: BlockMask, score_mod: Optional[Callable], scale: float,
             compiled: Optional[bool] = None) -> Tensor:
    """``flex_attention(q[B, h, Nq, d], k, v[B, h, Nk, d]) -> [B, h, Nq, d]``.

    Args:
        q, k, v: queries, keys and values.
        mask: the pattern's ``BlockMask``.
        score_mod: additive scores (``local``'s bias) or None.
        scale: 1/√d.
        compiled: use :func:`compiled_flex`; None: on CUDA only (eager elsewhere, see the module docstring).
    """
    if compiled if compiled is not None else q.device.type == "cuda":
        return compiled_flex()(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)
    with warnings.catch_warnings():  # eager is the unfused reference on purpose here
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)
