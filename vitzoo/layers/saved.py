"""What the plain layers keep for backward in a training forward on CPU: the ``memory()`` terms of blocks and models.

Each function returns :class:`vitzoo.costs.Saved` entries, measured against
:class:`vitzoo.measure.activations.SavedTensorCounter` (fp32 and bf16 autocast on CPU):

* ``LayerNorm`` keeps its input (in its own dtype: CPU autocast runs it in the input's dtype) and the per-row
  mean and reciprocal standard deviation in fp32.
* ``Linear`` and ``Conv2d`` keep their input, under autocast as a low-precision copy (or the tensor itself when it
  already is one), and the autocast copy of the weight (the bias's gradient needs nothing).
* ``GELU`` keeps its input; in-place ``ReLU`` its output.
* ``BatchNorm2d`` in training keeps its input and the batch mean and inverse standard deviation (fp32, per
  channel); weights and running statistics are parameters and buffers, not activations.
* ``Dropout`` with ``p > 0`` keeps its noise mask (the input's shape and dtype on CPU's path); with ``p = 0`` it
  returns its input and keeps nothing. timm's ``DropPath`` keeps its per-image keep mask ``[B, 1, 1]``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Optional

import torch
from torch import nn

from vitzoo.costs import Saved, itemsize


def prefixed(prefix: str, items: Iterable[Saved]) -> list[Saved]:
    """``items`` with their names under the module path ``prefix``: ``"qkv input"`` under ``"attn"`` becomes
    ``"attn: qkv input"``, and that under ``"blocks.0"`` ``"blocks.0.attn: qkv input"``.

    Args:
        prefix: the module's name in its parent; items: its memory formula's entries.
    """
    return [replace(s, name=f"{prefix}{'.' if ': ' in s.name else ': '}{s.name}") for s in items]


def layernorm_memory(tokens: int, dim: int, size: int) -> list[Saved]:
    """A LayerNorm over ``tokens`` rows of ``dim`` channels.

    Args:
        tokens: rows normalised (images × tokens); dim: channels; size: bytes per element of its input.
    """
    return [Saved("input", tokens * dim, size),  # [B, N, C] in the input's dtype
            Saved("row mean (fp32)", tokens, 4), Saved("row rstd (fp32)", tokens, 4)]  # [B, N, 1] each


def linear_memory(name: str, numel: int, weight_numel: int, amp: Optional[torch.dtype],
                  keep_input: bool = True) -> list[Saved]:
    """A linear layer or convolution: its input (``keep_input``: not already kept by another entry) at the
    autocast size, and under ``amp`` its weight's autocast copy.

    Args:
        name: the layer's name; numel: elements of its input; weight_numel: elements of its weight;
        amp: autocast dtype or ``None``; keep_input: list the input (False: it is another entry's storage).
    """
    size = itemsize(amp)
    items = [Saved(f"{name} input", numel, size)] if keep_input else []
    if amp is not None:
        items.append(Saved(f"{name} weight (autocast copy)", weight_numel, size))
    return items


def dropout_memory(name: str, p: float, numel: int, size: int) -> list[Saved]:
    """``nn.Dropout(p)`` in training: its noise mask, nothing at ``p = 0``.

    Args:
        name: the layer's name; p: drop probability; numel: elements of its input; size: bytes per element.
    """
    return [Saved(f"{name} mask", numel, size)] if p > 0 else []


def drop_path_memory(name: str, module: nn.Module, batch: int, size: int) -> list[Saved]:
    """timm's ``DropPath`` in training: the per-image keep mask ``[B, 1, 1]`` (``nn.Identity`` keeps nothing).

    Args:
        name: the layer's name; module: the block's drop-path module; batch: images; size: bytes per element
        of the branch it scales.
    """
    return [Saved(f"{name} keep mask", batch, size)] if getattr(module, "drop_prob", 0.0) > 0 else []


def mlp_memory(mlp: nn.Module, tokens: int, amp: Optional[torch.dtype]) -> list[Saved]:
    """timm's ``Mlp`` (fc1, GELU, dropout, fc2, dropout) on ``tokens`` rows.

    Args:
        mlp: the module; tokens: rows (images × tokens); amp: autocast dtype or ``None``.
    """
    size = itemsize(amp)
    c_in, hidden, c_out = mlp.fc1.in_features, mlp.fc1.out_features, mlp.fc2.out_features
    items = linear_memory("fc1", tokens * c_in, hidden * c_in, amp)  # [B, N, C]
    items.append(Saved("GELU input", tokens * hidden, size))  # fc1's output [B, N, hidden]
    items += dropout_memory("drop1", mlp.drop1.p, tokens * hidden, size)  # [B, N, hidden]
    # fc2's input is GELU's output, or drop1's where it drops: a fresh storage either way
    items += linear_memory("fc2", tokens * hidden, c_out * hidden, amp)
    return items + dropout_memory("drop2", mlp.drop2.p, tokens * c_out, size)  # [B, N, C]


def patchify_memory(batch: int, in_chans: int, image: tuple[int, int], dim: int, patch: int,
                    amp: Optional[torch.dtype]) -> list[Saved]:
    """A ``patch × patch`` stride-``patch`` convolution of the image (timm's ``PatchEmbed`` projection).

    Args:
        batch: images; in_chans: image channels; image: pixels (H, W); dim: output channels;
        patch: kernel and stride; amp: autocast dtype or ``None``.
    """
    numel = batch * in_chans * image[0] * image[1]  # the image [B, 3, H, W] (its autocast copy under amp)
    return linear_memory("proj", numel, dim * in_chans * patch * patch, amp)


def head_memory(batch: int, head: nn.Linear, amp: Optional[torch.dtype], drop: float, pooled_size: int,
                pooled_storage: int) -> list[Saved]:
    """Dropout on the pooled features, then the classifier: its input and, under ``amp``, its weight's copy.

    Args:
        batch: images; head: the classifier; amp: autocast dtype or ``None``; drop: the head dropout's ``p``.
        pooled_size: bytes per element of the pooled features.
        pooled_storage: elements of the pooled features' storage (the class token ``x[:, 0]`` is a view of
            the final norm's output ``[B, N, C]``, a mean a fresh ``[B, C]``).
    """
    features = batch * head.in_features  # [B, C]
    items = dropout_memory("head_drop", drop, features, pooled_size)
    cast = amp is not None and pooled_size != itemsize(amp)  # a fresh [B, C] autocast copy
    numel = features if drop > 0 or cast else pooled_storage  # dropout's output is a fresh [B, C]
    return items + linear_memory("head", numel, head.out_features * head.in_features, amp)
