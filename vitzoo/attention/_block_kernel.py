"""The compiled CPU kernel of :func:`vitzoo.attention._gather.block_attention` (``csrc/block_attention.cpp``).

Paper: Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness", NeurIPS 2022,
https://arxiv.org/abs/2205.14135 (the backward recomputes the probabilities from the saved log-sum-exp).

One C++ task per (image, head) walks the blocks: it copies a block's query, key and value rows into buffers
that stay in cache, multiplies them with register-blocked loops and adds the block's gradients to its head's
rows. Against the PyTorch path (gathered chunks, one SDPA call or five ``bmm`` per chunk, ``index_add_``) it
saves the gathered copies, the per-chunk Python and the scatter of strided gradients; it stores what that path
stores (its inputs and the log-sum-exp).

The kernel is built with ``torch.utils.cpp_extension`` (ninja and a C++ compiler) on first use, cached under
``~/.cache/torch_extensions`` per CPU, and used for float32/float64 CPU tensors. Where it cannot be built, a
warning names the reason once and the PyTorch path runs; ``VITZOO_BLOCK_KERNEL=0`` skips it.
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils import _python_dispatch

SOURCE = Path(__file__).parent / "csrc" / "block_attention.cpp"
ENV = "VITZOO_BLOCK_KERNEL"  # "0": never build or use the kernel
DTYPES = (torch.float32, torch.float64)
_state: dict[str, Optional[ModuleType]] = {}


def _cpu_tag() -> str:
    """A short hash of the CPU's model and flags: the build uses ``-march=native``, so one build per CPU."""
    info = ""
    if os.path.exists("/proc/cpuinfo"):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        info = "\n".join(sorted({ln for ln in lines if ln.startswith(("flags", "model name"))}))
    return hashlib.sha1(f"{platform.machine()}\n{info}".encode()).hexdigest()[:10]


def _build() -> ModuleType:
    from torch.utils.cpp_extension import load
    if shutil.which("ninja") is None:  # the ninja wheel's binary, when its environment is not activated
        import ninja
        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])
    flags = ["-O3", "-march=native", "-fopenmp"]  # OpenMP: at::parallel_for runs the (image, head) tasks
    return load(f"vitzoo_block_attention_{_cpu_tag()}", [str(SOURCE)], extra_cflags=flags,
                extra_ldflags=["-fopenmp"], verbose=False)


def kernel() -> Optional[ModuleType]:
    """The built extension, or None (disabled by ``VITZOO_BLOCK_KERNEL=0``, or the build failed: warned once)."""
    if os.environ.get(ENV, "1") == "0":
        return None
    if "ext" not in _state:
        try:
            _state["ext"] = _build()
        except Exception as err:  # no compiler, no ninja, a read-only cache: the PyTorch path still works
            _state["ext"] = None
            warnings.warn(f"vitzoo's block attention kernel could not be built ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}); using the slower PyTorch path. "
                          f"Set {ENV}=0 to skip the build.", RuntimeWarning, stacklevel=2)
    return _state["ext"]


def usable(*tensors: Optional[Tensor]) -> bool:
    """Whether the kernel runs these tensors: float32/float64 on the CPU, no dispatch mode watching the aten ops
    (``FlopCounterMode`` and shape recorders see the PyTorch path's ops; the kernel is one opaque call), and it
    could be built."""
    real = [t for t in tensors if t is not None]
    return (all(t.device.type == "cpu" and t.dtype in DTYPES for t in real)
            and _python_dispatch._get_current_dispatch_mode() is None and kernel() is not None)


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
