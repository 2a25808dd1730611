"""The one dispatch of the fast paths: which implementation runs an op for one call.

:data:`TABLE` maps each op name to its implementations in order of preference, each with the condition under
which it runs; :func:`select` returns the first whose condition holds for the call's arguments. The choice
between a compiled CPU kernel (:mod:`vitzoo.cpu_kernels`, off with ``VITZOO_CPU_KERNELS=0``), a custom autograd
Function, a checkpointed or plain PyTorch path and FlexAttention (a sparse pattern's ``attention.impl``) is
made here and nowhere else.

Ops and the arguments :func:`select` takes for them:

* ``window_attention`` ``(qkv, p_drop, window_heads)``: ``cpu_core`` (:func:`vitzoo.ops.window.window_core`:
  CPU, no attention dropout, eager; in inference only from :data:`~vitzoo.ops.window_ops.INFER_MIN_WINDOW_HEADS`
  windows × heads per call) or ``sdpa`` (the backend's own SDPA form).
* ``sparse_pattern`` ``(impl, device, training, attn_drop, needs_grad)``: ``flex`` (FlexAttention) or
  ``blocked`` (halo / gathered blocks); ``impl`` is the config's ``auto``, ``blocked`` or ``flex``.
* ``block_attention`` ``(q, k, v, k_glob, v_glob, p_drop)``: ``autograd_function`` (CPU training: recomputed
  from the log-sum-exp), ``checkpoint`` (training elsewhere), ``cpu_kernel`` (inference through the compiled
  block kernel) or ``sdpa``.
* ``halo_scores`` ``(q, k, v, p_drop)``: ``autograd_function`` (training without attention dropout, not traced:
  blocks and probabilities recomputed in backward from the log-sum-exp) or ``plain`` (the ops autograd records).
* ``block_function`` ``(q, k, v, k_glob, v_glob)``: inside ``block_attention``'s autograd Function, ``cpu_kernel``
  (the compiled block kernel) or ``flash_cpu`` (torch's CPU flash attention per chunk of blocks).
* ``feature_attention`` ``(kind, qkv, omega, scale)``: ``cpu_kernel`` (the compiled feature kernel) or ``torch``.
* ``axial_pass`` ``(x, weight, p_drop)`` (the pass's q/k/v projection input and weight): ``autograd_function``
  (:mod:`vitzoo.ops.axial`: CPU training without attention dropout, eager) or ``sdpa`` (the backend's per-line SDPA).
* ``sdpa`` ``(q, k, v, attn_mask, dropout_p)``: ``fp32_backward`` (:mod:`vitzoo.ops.sdpa`: CPU training in bf16 or
  fp16 on short key sequences, the fused forward with its backward on fp32 copies) or ``native``
  (``F.scaled_dot_product_attention``).
* ``fused_qkv`` ``()``: ``plain_forward`` under ``torch.jit.trace`` (which cannot record an autograd Function)
  or ``autograd_function`` (efficient, feature-map and Linformer attention from the fused projection).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

import vitzoo.ops.sdpa as sdpa_ops
import vitzoo.ops.window as window_ops
from vitzoo.cpu_kernels import block_kernel, feature_kernel, tracing
from vitzoo.registry import ConfigError

Rule = tuple[str, Callable[..., bool]]
IMPLS = ("auto", "blocked", "flex")  # the one list of a sparse pattern's attention.impl values


def _always(*_: Any) -> bool:
    return True


def _window_core(qkv: Tensor, p_drop: float, window_heads: int) -> bool:
    """On the CPU without attention dropout, eager (not traced or compiled, where the plain SDPA expression is
    kept); in inference only for at least ``INFER_MIN_WINDOW_HEADS`` windows × heads (``window_heads`` per image)."""
    if qkv.device.type != "cpu" or p_drop != 0.0 or tracing():
        return False
    training = torch.is_grad_enabled() and qkv.requires_grad
    return training or qkv.shape[0] * window_heads >= window_ops.INFER_MIN_WINDOW_HEADS


def _flex(impl: str, device: Any, training: bool = False, attn_drop: float = 0.0, needs_grad: bool = False) -> bool:
    """``impl=auto`` picks FlexAttention on CUDA unless training with attention dropout; ``impl=flex`` where it
    cannot run (dropout, a backward off CUDA) is a one-line ConfigError naming ``attention.impl``."""
    if impl not in IMPLS:
        raise ConfigError(f"attention.impl must be one of {', '.join(IMPLS)} (got {impl!r})")
    device = torch.device(device)
    dropout = training and attn_drop > 0
    if impl == "auto":
        return device.type == "cuda" and not dropout
    if impl == "flex":
        if dropout:
            raise ConfigError(f"attention.impl=flex has no attention dropout (model.attn_drop_rate={attn_drop}); "
                              f"use attention.impl=auto or blocked, or attn_drop_rate=0")
        if device.type != "cuda" and needs_grad:
            raise ConfigError(f"attention.impl=flex has no backward on {device.type} in torch {torch.__version__} "
                              f"(forward only); train with attention.impl=auto or blocked")
    return impl == "flex"


def _training(q: Tensor, k: Tensor, v: Tensor, *_: Any) -> bool:
    return torch.is_grad_enabled() and not torch.jit.is_tracing() and any(t.requires_grad for t in (q, k, v))


def _block_function(q: Tensor, k: Tensor, v: Tensor, k_glob: Optional[Tensor], v_glob: Optional[Tensor],
                    p_drop: float) -> bool:
    """Training on the CPU without dropout or autocast, every tensor in ``q``'s dtype."""
    same = all(t is None or t.dtype == q.dtype for t in (k, v, k_glob, v_glob))
    cpu = q.device.type == "cpu" and p_drop == 0.0 and same and not torch.is_autocast_enabled("cpu")
    return _training(q, k, v) and cpu


def _halo_function(q: Tensor, k: Tensor, v: Tensor, p_drop: float) -> bool:
    """Training without attention dropout, eager (not traced or compiled)."""
    return p_drop == 0.0 and not tracing() and _training(q, k, v)


def _block_kernel(q: Tensor, k: Tensor, v: Tensor, k_glob: Optional[Tensor], v_glob: Optional[Tensor],
                  p_drop: float) -> bool:
    return p_drop == 0.0 and block_kernel.usable(q, k, v, k_glob, v_glob)


def _axial_function(x: Tensor, weight: Tensor, p_drop: float) -> bool:
    """Training on the CPU without attention dropout, eager (not traced or compiled)."""
    return x.device.type == "cpu" and p_drop == 0.0 and not tracing() and _training(x, weight, weight)


TABLE: dict[str, tuple[Rule, ...]] = {
    "window_attention": (("cpu_core", _window_core), ("sdpa", _always)),
    "sparse_pattern": (("flex", _flex), ("blocked", _always)),
    "block_attention": (("autograd_function", _block_function), ("checkpoint", _training),
                        ("cpu_kernel", _block_kernel), ("sdpa", _always)),
    "halo_scores": (("autograd_function", _halo_function), ("plain", _always)),
    "block_function": (("cpu_kernel", block_kernel.usable), ("flash_cpu", _always)),
    "feature_attention": (("cpu_kernel", feature_kernel.usable), ("torch", _always)),
    "axial_pass": (("autograd_function", _axial_function), ("sdpa", _always)),
    "fused_qkv": (("plain_forward", torch.jit.is_tracing), ("autograd_function", _always)),
    "sdpa": (("fp32_backward", sdpa_ops.applies), ("native", _always)),
}


def implementations(op: str) -> tuple[str, ...]:
    """The implementations of ``op`` in order of preference (the last one always applies)."""
    return tuple(name for name, _ in TABLE[op])


def select(op: str, *args: Any) -> str:
    """The first implementation of ``op`` whose condition holds for this call.

    Args:
        op: a key of :data:`TABLE`.
        args: the call's arguments the op's conditions read (module docstring).
    """
    for name, applies in TABLE[op]:
        if applies(*args):
            return name
    raise AssertionError(f"no implementation of {op} applies")  # the last rule of each op always holds
