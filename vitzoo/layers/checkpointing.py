"""Activation checkpointing of one block: its forward runs again in backward instead of keeping its activations.

:func:`run_block` is what ViT and Swin call per block when ``model.grad_checkpointing`` is on. It uses
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``, which keeps only the block's input and
restores the random number generator state for the second run, so dropout, stochastic depth and the
backends that draw in training (reformer's rotations) draw the same numbers twice.

A block may also update its buffers in forward (routing's k-means centroids, a BatchNorm's running
statistics, which change without a version bump). The second run must see them as the first one did, and
must not update them again: the block's persistent buffers (its state, all small) are copied before the first
run, and the second run reads and updates the copies, swapped in for the buffers and swapped out after. The
model's state after the step is that of a run without checkpointing.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


class _Replay:
    """The block's forward as a function that runs a second time with the buffers of the first run.

    Args:
        block: the module to run; called as ``block(*args)``.
    """

    def __init__(self, block: nn.Module):
        self.block = block
        persistent = set(block.state_dict(keep_vars=True))
        self.saved = [  # (owner, name, buffer, a copy) for each persistent buffer
            (owner, name, buf, buf.detach().clone())
            for owner_name, owner in block.named_modules()
            for name, buf in owner.named_buffers(recurse=False)
            if buf is not None and _qualified(owner_name, name) in persistent
        ]
        self.calls = 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        swapped = self.saved if self.calls > 1 else []
        for owner, name, _, copy in swapped:
            owner._buffers[name] = copy  # the second run reads (and updates) the copy
        try:
            return self.block(*args)
        finally:
            for owner, name, buf, _ in swapped:
                owner._buffers[name] = buf


def _qualified(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def run_block(block: nn.Module, x: Tensor, *args: Any, enabled: bool = True) -> Tensor:
    """``block(x, *args)``, checkpointed when ``enabled`` and the block is training with gradients on.

    Args:
        block: a transformer block (or any module called as ``block(x, *args)``).
        x: its input tensor.
        args: the rest of its inputs (the token grid).
        enabled: checkpoint at all (``model.grad_checkpointing``); evaluation and ``no_grad`` never do.

    Returns:
        The block's output, equal to ``block(x, *args)``.
    """
    if not (enabled and block.training and torch.is_grad_enabled()):
        return block(x, *args)
    return checkpoint(_Replay(block), x, *args, use_reentrant=False)
