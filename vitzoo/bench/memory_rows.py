"""The predicted peak of a benchmark model row, term by term, beside its measured live peak.

The benchmark's training peak (``train_peak_mb``) is the live peak of two AdamW steps on one random batch,
over the resident size before the model was built (:class:`vitzoo.measure.memory.PeakMemory`). The
prediction adds up what that process holds at the peak, each term a CSV column in MiB::

    predicted_params_mb      parameters (fp32)
    predicted_optimizer_mb   the AdamW state after the steps (two moments per parameter, a step count per tensor)
    predicted_input_mb       the random batch, its labels and the batch-1 copy the benchmark keeps
    predicted_held_mb        what the step holds at its fullest beside those three
                             (:func:`vitzoo.measure.predicted.held_peak_bytes`), the larger of its phases:
                             backward, the activations and gradients held together at its fullest point (the
                             step sets its gradients to None, so backward makes each block's gradients as it
                             frees the activations of the blocks after it) + predicted_transient_mb; AdamW's
                             step, every gradient + two temporaries the size of the largest parameter
    predicted_runtime_mb     CPU: the oneDNN kernel caches of the step's distinct matmul and convolution calls
                             (``predicted_kernels`` of them; :mod:`vitzoo.measure.kernel_cache`): measured by
                             replaying those calls once in a fresh process, about 0.6 MB a bf16 matmul shape,
                             near 0 in float32 (MKL keeps nothing per shape); kept for the process's life
    predicted_peak_mb        their sum; peak_ratio = train_peak_mb / predicted_peak_mb

Beside them, not summed: ``predicted_transient_mb``, the largest transient of one op's backward
(:attr:`vitzoo.costs.Saved.transient`: the gradient of one saved tensor, made while it is still held, and the
kernel's workspace where a mixer declares one), part of the held term; ``predicted_activation_mb``
(``model.memory(batch, amp, grid)``, every tensor the forward keeps for backward) and ``predicted_grads_mb`` (one
gradient per trainable parameter), of which the held term holds what is alive together. ``predicted_top_saved``
names the two largest saved tensors of :meth:`memory`, summed over the blocks (``"mlp: GELU input"`` is every
block's GELU input). The allocator's own overhead, the thread pools' buffers and the small tensors of the
optimizer's per-parameter loop are not in the prediction: the ratio shows them; memory-only rows measure
``resident_other_mb``, what the process keeps resident after the steps beyond its tensors (the kernel caches of
``predicted_runtime_mb`` and what else no tensor holds).
"""
from __future__ import annotations

import gc
import re
from collections.abc import Sequence
from typing import Any, Optional

import torch
from torch import nn

from vitzoo.attention import before_train_step
from vitzoo.costs import Saved
from vitzoo.measure.kernel_cache import KernelShapes, kernel_cache_mb
from vitzoo.measure.memory import _file_kb, _malloc_live, _proc_status_kb
from vitzoo.measure.predicted import MIB, held_peak_bytes, largest_transient, optimizer_state_bytes, parameter_bytes

PREDICTION_COLUMNS = ["predicted_peak_mb", "peak_ratio", "predicted_activation_bytes", "predicted_activation_mb",
                      "predicted_params_mb", "predicted_grads_mb", "predicted_optimizer_mb", "predicted_input_mb",
                      "predicted_held_mb", "predicted_transient_mb", "predicted_runtime_mb", "predicted_kernels",
                      "predicted_top_saved", "resident_other_mb"]
_BLOCK_PREFIX = re.compile(r"^(stages\.\d+\.)?(blocks\.\d+)?[.:]?\s*")  # "stages.0.blocks.1.attn: x" -> "attn: x"


def saved_groups(items: Sequence[Saved]) -> list[tuple[str, int]]:
    """The saved tensors' bytes summed by name over the blocks (and Swin's stages), largest first.

    Args:
        items: the entries of a model's ``memory()``.
    """
    groups: dict[str, int] = {}
    for item in items:
        name = _BLOCK_PREFIX.sub("", item.name) or item.name
        groups[name] = groups.get(name, 0) + item.nbytes
    return sorted(groups.items(), key=lambda kv: (-kv[1], kv[0]))


def top_saved(items: Sequence[Saved], count: int = 2) -> str:
    """The ``count`` largest groups of :func:`saved_groups` as ``"name MB; name MB"``.

    Args:
        items: the entries of a model's ``memory()``; count: how many groups to name.
    """
    return "; ".join(f"{name} {nbytes / MIB:.1f} MB" for name, nbytes in saved_groups(items)[:count])


def _tensor_bytes(tensors: Sequence[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def predicted_row(model: nn.Module, optimizer: Any, inputs: Sequence[torch.Tensor], batch: int,
                  amp: bool) -> dict[str, Any]:
    """The prediction columns (:data:`PREDICTION_COLUMNS` but ``peak_ratio``) of one model row.

    Args:
        model: the benchmarked model (ViT or Swin with ``memory()``).
        optimizer: its AdamW after the measured steps (its state is counted as it is).
        inputs: the tensors the benchmark keeps beside the model (batch, labels, batch-1 copy).
        batch: images per step; amp: bf16 autocast or not (the grid is the one the model is built at).

    Returns:
        The columns, or ``{"predicted_note": why}`` where the model has no memory formula for a part.
    """
    try:
        items = model.memory(batch, torch.bfloat16 if amp else None)
    except NotImplementedError as exc:
        return {"predicted_note": f"no memory(): {str(exc).splitlines()[0] if str(exc) else 'not implemented'}"}
    activations = sum(item.nbytes for item in items)
    terms = {
        "predicted_params_mb": parameter_bytes(model) / MIB,
        "predicted_optimizer_mb": optimizer_state_bytes(optimizer) / MIB,
        "predicted_input_mb": _tensor_bytes(inputs) / MIB,
        "predicted_held_mb": held_peak_bytes(model, items, optimizer) / MIB,
    }
    return {"predicted_peak_mb": sum(terms.values()), "predicted_activation_bytes": activations, **terms,
            "predicted_transient_mb": largest_transient(items) / MIB, "predicted_activation_mb": activations / MIB,
            "predicted_grads_mb": parameter_bytes(model, trainable=True) / MIB, "predicted_top_saved": top_saved(items)}


def memory_phase(row: dict[str, Any], setup: Any, steps: Any, batch: int) -> None:
    """The training phase without timing: the live peak of two training steps (``train_peak_mb``).

    Args:
        row: the model row, updated; setup: the worker's ``_Setup``; steps: the model's ``_ModelSteps``;
        batch: images per step.
    """
    steps.train_mode()
    setup.memory.start()
    for _ in range(2):
        steps.train_step()
    row["train_peak_mb"] = setup.memory.peak_mb()
    add_prediction(row, steps, setup, batch)
    other = resident_other_mb(setup, steps)
    if other is not None:
        row["resident_other_mb"] = other


def resident_other_mb(setup: Any, steps: Any) -> Optional[float]:
    """MiB the process keeps resident after the steps, gradients freed, beyond its parameters, optimizer state and
    inputs: memory no tensor holds (the CPU kernels' code and caches; bf16 autocast's are the larger), measured.

    Args:
        setup: the worker's ``_Setup`` (its live :class:`~vitzoo.measure.memory.PeakMemory` baseline);
        steps: the model's ``_ModelSteps`` after the training steps. None off a Linux CPU live measurement.
    """
    mem = setup.memory
    if not getattr(mem, "live", False) or not getattr(mem, "hwm", False):
        return None
    steps.opt.zero_grad(set_to_none=True)
    gc.collect()
    _malloc_live(True)  # return freed blocks to the system, as during the measured phase
    resident = (_proc_status_kb("VmRSS") - (_file_kb() - mem.file_kb if mem.file_kb else 0) - mem.base_kb) / 1024
    _malloc_live(False)
    held = parameter_bytes(steps.model) + optimizer_state_bytes(steps.opt)
    return resident - (held + _tensor_bytes((steps.x, steps.y, steps.x1))) / MIB


def add_prediction(row: dict[str, Any], steps: Any, setup: Any, batch: int) -> None:
    """Add the prediction for the row's training step and ``peak_ratio`` (measured / predicted), in place.

    Args:
        row: the model row (``train_peak_mb`` measured); steps: the model's ``_ModelSteps`` (model,
            optimizer and inputs) after the training steps; setup: the worker's ``_Setup``; batch: images per step.
    """
    if steps.opt is None:
        return
    row.update(predicted_row(steps.model, steps.opt, (steps.x, steps.y, steps.x1), batch, setup.amp))
    if row.get("predicted_peak_mb") and setup.device.type == "cpu":
        calls = kernel_calls(steps)
        runtime = kernel_cache_mb(calls, torch.get_num_threads())
        if runtime is not None:
            row.update(predicted_runtime_mb=runtime, predicted_kernels=len(calls))
            row["predicted_peak_mb"] += runtime
    if row.get("predicted_peak_mb") and row.get("train_peak_mb") is not None:
        row["peak_ratio"] = row["train_peak_mb"] / row["predicted_peak_mb"]


def kernel_calls(steps: Any) -> list[list[Any]]:
    """The distinct matmul and convolution calls (:class:`~vitzoo.measure.kernel_cache.KernelShapes`) of one more
    forward and backward of the row's training step, untimed, its gradients freed after.

    Args:
        steps: the model's ``_ModelSteps`` (model, inputs, the worker's autocast) after the measured steps.
    """
    shapes = KernelShapes()
    before_train_step(steps.model)
    with shapes:
        with steps.setup.autocast():
            loss = nn.functional.cross_entropy(steps.model(steps.x), steps.y)
        loss.backward()
    steps.model.zero_grad(set_to_none=True)
    return shapes.calls
