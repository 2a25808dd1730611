"""The compiled CPU kernel of :func:`vitzoo.ops.gather.block_attention` (``csrc/block_attention.cpp``).

Paper: Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness", NeurIPS 2022,
https://arxiv.org/abs/2205.14135 (the backward recomputes the probabilities from the saved log-sum-exp).

One C++ task per (image, head) walks the blocks: it copies a block's query, key and value rows into buffers
that stay in cache, multiplies them with register-blocked loops and adds the block's gradients to its head's
rows. Against the PyTorch path (gathered chunks, one SDPA call or five ``bmm`` per chunk, ``index_add_``) it
saves the gathered copies, the per-chunk Python and the scatter of strided gradients; it stores what that path
stores (its inputs and the log-sum-exp).

Built on first use and optional (:mod:`vitzoo.cpu_kernels.loader`): float32/float64 CPU tensors; where it cannot be
built the PyTorch path runs.
"""
from __future__ import annotations

from types import ModuleType
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from vitzoo.cpu_kernels import loader

STEM = "block_attention"  # csrc/block_attention.cpp


def kernel() -> Optional[ModuleType]:
    """The built extension, or None (see :func:`vitzoo.cpu_kernels.loader.extension`)."""
    return loader.extension(STEM)


def usable(*tensors: Optional[Tensor]) -> bool:
    """Whether the kernel runs these tensors (:func:`vitzoo.cpu_kernels.loader.usable`)."""
    return loader.usable(STEM, *tensors)


def keep_layout(mask: Tensor, queries: int) -> Tensor:
    """Boolean ``mask[(c,) n, S or 1, K]`` as the kernel's bytes ``[c or 1, n, Kp, Sp]``: transposed (keys
    first), broadcast to the block's S ``queries``, keys padded to a multiple of 4 and queries to 16 with zeros."""
    mask = mask if mask.dim() == 4 else mask[None]
    keep = mask.transpose(2, 3).to(torch.uint8).expand(-1, -1, -1, queries)  # [c or 1, n, K, S]
    return F.pad(keep, (0, -queries % 16, 0, -keep.shape[2] % 4)).contiguous()


def forward(q: Tensor, k: Tensor, v: Tensor, k_glob: Tensor, v_glob: Tensor, q_ids: Tensor, k_ids: Tensor,
            keep: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """Outputs ``[B, c, n, S, d]`` in block order and the log-sum-exp ``[B, c, n, S]`` (log2 units).

    Args:
        q, k, v: ``[B, c, L, d]`` (the last dim contiguous; any other strides).
        k_glob, v_glob: ``[B, c, G, d]`` global keys/values (G may be 0).
        q_ids: ``[n, S]``; k_ids: ``[c or 1, n, K]`` (contiguous).
        keep: :func:`keep_layout` of the mask with the G global columns in front.
        scale: 1/√d.
    """
    return tuple(kernel().block_forward(q, k, v, k_glob, v_glob, q_ids, k_ids, keep, scale))


def backward(q: Tensor, k: Tensor, v: Tensor, k_glob: Tensor, v_glob: Tensor, q_ids: Tensor, k_ids: Tensor,
             keep: Tensor, scale: float, lse: Tensor, grad: Tensor, rows: Optional[Tensor]) -> tuple[Tensor, ...]:
    """Gradients of ``q, k, v, k_glob, v_glob``; the probabilities are recomputed from ``lse``.

    Args:
        grad: ``[B, c, L_out, d]`` output gradient (head dim contiguous, any other strides).
        rows: ``[n·S]`` output row of each block slot (-1: none, no gradient), or None: slot i is row i.
        others: as :func:`forward`.
    """
    rows = grad.new_empty(0, dtype=torch.long) if rows is None else rows
    grad = grad if grad.stride(-1) == 1 else grad.contiguous()
    return tuple(kernel().block_backward(q, k, v, k_glob, v_glob, q_ids, k_ids, keep, scale, lse, grad, rows))
