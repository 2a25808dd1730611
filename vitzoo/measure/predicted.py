"""The predicted memory of a training step, from the model's analytic ``memory()`` and the training state.

:func:`predicted_memory` adds up what one step holds at its peak::

    parameters + optimizer state
    + what the step holds at its fullest beside them (:func:`held_peak_bytes`), the larger of its two phases:
      backward: activations and gradients together at the backward's fullest point + the largest transient
      optimizer step: every gradient + AdamW's temporaries (:func:`step_temporaries`)

The activations are ``model.memory(batch, amp, grid)``, the tensors the forward keeps for backward; the
gradients are one per trainable parameter, in its dtype. The step zeroes its gradients to ``None`` first, so
backward makes them as it goes: running from the last block to the first, at block ``b`` the process holds the
activations of the blocks up to ``b`` and the gradients of the parameters of the blocks from ``b`` on, and the
backward's part is the largest of those sums over ``b`` and of the forward's end (every activation, no gradient
yet). Items and parameters are placed by their name's prefix (:func:`segment`: a block, a Swin stage's merge, or
a top-level module; parameters of the model itself, the class token and position embedding, with the stem), in
the model's module order. The transient is the largest :attr:`~vitzoo.costs.Saved.transient` of one op's
backward: the gradient of one saved tensor, made while it is held, and the kernel's workspace where a mixer
declares one.

The optimizer state is that of the optimizer given (every tensor in its ``state``, each storage once), or,
before a step has made it, :data:`ADAMW_STATE_BYTES` per trainable element (AdamW's two fp32 moments). The
activations are CPU's saved set (the kernels CPU runs); the allocator's cache, the data loader, the CUDA
context and, on CPU, the interpreter and libraries of the process come on top of a measured peak.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Optional

import torch
from torch import nn

from vitzoo.costs import Saved

ADAMW_STATE_BYTES = 8  # AdamW keeps two fp32 moments (4 + 4 bytes) per trainable parameter element
MIB = 2**20
# the forward position of a memory item or parameter name: "stages.1.blocks.0", "blocks.3", "stages.0.downsample",
# else its top-level module ("patch_embed", "norm", "head" of "head input")
_SEGMENT = re.compile(r"(?:stages\.\d+\.)?(?:blocks\.\d+|downsample)(?![\w])|[A-Za-z_]\w*")


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


def segment(name: str) -> str:
    """The forward position ``name`` (a ``memory()`` item's or a parameter's) belongs to: its block
    (``"blocks.3"``, ``"stages.1.blocks.0"``), a stage's merge (``"stages.0.downsample"``) or its top-level module.

    Args:
        name: e.g. ``"stages.1.blocks.0.attn: q|k|v"`` or ``"patch_embed.proj.weight"``.
    """
    m = _SEGMENT.match(name)
    return m.group(0) if m else name


def backward_peak(activations: Sequence[int], gradients: Sequence[int]) -> int:
    """The most a backward holds of activations and gradients together, positions in forward order: at position
    ``b`` the activations of positions ``<= b`` and the gradients of positions ``>= b``; the forward's end (every
    activation, no gradient) included.

    Args:
        activations: bytes saved by each position; gradients: bytes of each position's parameter gradients.
    """
    held = peak = sum(activations)
    for act, grad in zip(reversed(activations), reversed(gradients)):  # from the last position to the first
        held += grad  # the position's gradients are made while its activations are still held
        peak = max(peak, held)
        held -= act  # then its activations are freed
    return peak


def held_peak_bytes(model: nn.Module, items: Sequence[Saved], optimizer: Any = None) -> int:
    """What one training step holds at its fullest beside the parameters, the optimizer state and the input: the
    larger of its two phases.

    * backward: :func:`backward_peak` of the activations ``items`` (the model's ``memory()``) and the trainable
      parameters' gradients, each placed by :func:`segment` in the order of ``model.named_modules()`` (a name of no
      module, as the model's own class token and position embedding, goes with the stem, first), plus
      :func:`largest_transient`;
    * optimizer step: every gradient, the activations freed, plus :func:`step_temporaries`.

    Args:
        model: a vitzoo model; items: the entries of its ``memory(batch, amp, grid)``.
        optimizer: the run's AdamW (None: torch's default implementation for the parameters' device).
    """
    order = {"": 0}  # the model's own parameters and any name of no module: with the stem
    for name, _ in model.named_modules():
        if name:
            order.setdefault(segment(name), len(order))
    activations, gradients = [0] * len(order), [0] * len(order)
    for item in items:
        activations[order.get(segment(item.name), 0)] += item.nbytes
    for name, p in model.named_parameters():
        if p.requires_grad:
            gradients[order.get(segment(name), 0)] += p.numel() * p.element_size()
    backward = backward_peak(activations, gradients) + largest_transient(items)
    return max(backward, sum(gradients) + step_temporaries(model, optimizer))


def step_temporaries(model: nn.Module, optimizer: Any = None) -> int:
    """Bytes AdamW's step makes beside its state, from the square root of the second moment: the for-loop
    implementation (torch's default on CPU) holds two tensors of the parameter it updates (the root, then its
    quotient by the bias correction), the foreach one (torch's default on CUDA) the roots of every parameter at once.

    Args:
        model: its trainable parameters are the optimizer's; optimizer: the run's (its ``foreach`` option, where
            set, picks the implementation).
    """
    sizes = [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]
    foreach = optimizer.defaults.get("foreach") if optimizer is not None else None
    if foreach is None:
        foreach = any(p.is_cuda for p in model.parameters())
    return sum(sizes) if foreach else 2 * max(sizes, default=0)


def largest_transient(items: Sequence[Saved]) -> int:
    """Bytes of the largest :attr:`~vitzoo.costs.Saved.transient` of ``items``: what one op's backward makes while
    its saved tensors are held (the gradient of one of them and its kernel's workspace), 0 for no items."""
    return max((item.transient for item in items), default=0)


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
        items = model.memory(batch, amp, grid=grid)
    except NotImplementedError:
        return {"predicted_activation_bytes": None, "predicted_peak_mb": None}
    activations = sum(item.nbytes for item in items)
    state = optimizer_state_bytes(optimizer) if optimizer is not None else 0
    if not state:
        state = ADAMW_STATE_BYTES * sum(p.numel() for p in model.parameters() if p.requires_grad)
    peak = parameter_bytes(model) + state + held_peak_bytes(model, items, optimizer)
    return {"predicted_activation_bytes": activations, "predicted_peak_mb": peak / MIB}
