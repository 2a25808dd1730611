"""The predicted memory of a training step, from the model's analytic ``memory()`` and the training state.

:func:`predicted_memory` adds up what one step holds at its peak as a lower bound::

    parameters + gradients (one per trainable parameter, its dtype) + optimizer state
    + activations (``model.memory(batch, amp, grid)``: the tensors the forward keeps for backward)

The optimizer state is that of the optimizer given (every tensor in its ``state``, each storage once), or,
before a step has made it, :data:`ADAMW_STATE_BYTES` per trainable element (AdamW's two fp32 moments). The
activations are CPU's saved set (the kernels CPU runs); the allocator's cache, the transient tensors of the
backward, the data loader, the CUDA context and, on CPU, the interpreter and libraries of the process come
on top of a measured peak.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

ADAMW_STATE_BYTES = 8  # AdamW keeps two fp32 moments (4 + 4 bytes) per trainable parameter element
MIB = 2**20


def amp_dtype(precision: Optional[str]) -> Optional[torch.dtype]:
    """The autocast dtype of a Lightning ``precision`` (``bf16-mixed`` -> bfloat16, ``16-mixed`` -> float16,
    anything else, ``32-true`` included, -> ``None``).

    Args:
        precision: Lightning's ``trainer.precision`` value.
    """
    p = str(precision or "").lower()
    if p.endswith("-mixed"):
        return torch.bfloat16 if p.startswith("bf16") else torch.float16
    return None


def parameter_bytes(model: nn.Module, trainable: bool = False) -> int:
    """Bytes of the model's parameters (``trainable``: those with ``requires_grad``, i.e. the gradients' bytes)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad or not trainable)


def optimizer_state_bytes(optimizer: Any) -> int:
    """Bytes of the tensors in ``optimizer.state`` (moments, step counters), each storage once.

    Args:
        optimizer: a ``torch.optim.Optimizer``.
    """
    seen: dict[int, int] = {}
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.device.type != "meta":
                seen[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
    return sum(seen.values())


def predicted_memory(model: nn.Module, batch: int, amp: Optional[torch.dtype] = None,
                     grid: Optional[tuple[int, int]] = None, optimizer: Any = None) -> dict[str, Optional[float]]:
    """The predicted activation bytes and peak (MiB) of one training step of ``model`` (see the module docstring).

    Args:
        model: a vitzoo model (ViT or Swin: it has ``memory(batch, amp, grid=...)``).
        batch: images per step on one device.
        amp: autocast dtype or ``None`` for fp32.
        grid: token grid (default: the model's).
        optimizer: the run's optimizer, whose state is counted (None, or no state yet: AdamW's).

    Returns:
        ``predicted_activation_bytes`` and ``predicted_peak_mb``; both ``None`` where a mixer or token
        reduction of the model has no memory formula.
    """
    try:
        activations = sum(item.nbytes for item in model.memory(batch, amp, grid=grid))
    except NotImplementedError:
        return {"predicted_activation_bytes": None, "predicted_peak_mb": None}
    gradients = parameter_bytes(model, trainable=True)
    state = optimizer_state_bytes(optimizer) if optimizer is not None else 0
    if not state:
        state = ADAMW_STATE_BYTES * sum(p.numel() for p in model.parameters() if p.requires_grad)
    peak = parameter_bytes(model) + gradients + state + activations
    return {"predicted_activation_bytes": activations, "predicted_peak_mb": peak / MIB}
