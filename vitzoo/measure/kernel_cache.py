"""The resident size of the CPU kernel caches a training step fills: one compiled oneDNN kernel per distinct shape.

On the CPU, bf16 matmuls and every convolution run through oneDNN, which compiles a kernel for each distinct
call (op, shapes, strides, dtypes) and keeps it in two caches, oneDNN's primitive cache
(``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) and ideep's (``LRU_CACHE_CAPACITY``), each of 1,024 entries by default:
about 0.6 MB per bf16 matmul shape on an AMX Xeon, more where a dimension leaves a partial block. A training
process keeps them for its whole life; the tensors never hold them. float32 matmuls run through MKL, which
keeps nothing per shape. The CPU flash-attention kernel of ``scaled_dot_product_attention`` keeps buffers of
its own after a bf16 backward; its calls are recorded and replayed the same way.

:class:`KernelShapes` records the distinct matmul and convolution calls of a step (a dispatch mode), and
:func:`kernel_cache_mb` measures what those calls leave resident by replaying each once on zero-filled inputs
in a fresh process (``python -m vitzoo.measure.kernel_cache``): the caches of exactly these shapes, apart
from any model, batch data or gradient. The answer is kept per machine, thread count, torch version and shape
set in ``$VITZOO_CACHE/kernel_cache.json`` (``~/.cache/vitzoo``).
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from vitzoo.fileio import atomic_write_text, read_regular_text
from vitzoo.measure.memory import _file_kb, _glibc, _malloc_live, _proc_status_kb

# the ops that reach oneDNN on the CPU (linear is addmm / mm by then, matmul and einsum are mm / bmm), and
# scaled_dot_product_attention's CPU flash kernel, whose backward keeps its bf16 work buffers (3.5 MB in swin_cifar)
KERNEL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward",
                        "_scaled_dot_product_flash_attention_for_cpu",
                        "_scaled_dot_product_flash_attention_for_cpu_backward"})


def _spec(value: Any) -> Any:
    """A tensor as ``{"t": [shape, stride, dtype]}`` (what a kernel cache keys on), anything else as it is."""
    if isinstance(value, torch.Tensor):
        return {"t": [list(value.shape), list(value.stride()), str(value.dtype).removeprefix("torch.")]}
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(value)
    return value


class KernelShapes(TorchDispatchMode):
    """Records each distinct call of :data:`KERNEL_OPS` (its op and its arguments with tensors as shape, stride and
    dtype) while active; :attr:`calls` is the sorted list, JSON-ready."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func.overloadpacket.__name__ in KERNEL_OPS:
            self._seen.add(json.dumps([func.name(), tree_map(_spec, list(args)), tree_map(_spec, kwargs)]))
        return func(*args, **kwargs)

    @property
    def calls(self) -> list[list[Any]]:
        return [json.loads(c) for c in sorted(self._seen)]


def _tensor(spec: list[Any]) -> torch.Tensor:
    shape, stride, dtype = spec
    return torch.empty_strided(shape, stride, dtype=getattr(torch, dtype)).zero_()


def _unspec(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"t"}:
        return _tensor(value["t"])
    if isinstance(value, list):
        return [_unspec(v) for v in value]
    return value


def _resident_kb(file_kb: int) -> int:
    """Resident KiB without file-backed pages, freed blocks returned to the system first (malloc in live mode)."""
    gc.collect()
    _malloc_live(True)
    return _proc_status_kb("VmRSS") - (_file_kb() - file_kb)


def replay_mb(calls: list[list[Any]]) -> float:
    """MiB this process keeps resident after one call of each of ``calls`` (:attr:`KernelShapes.calls`), its inputs
    and outputs freed: run it in a fresh process, where the kernel caches hold nothing yet.

    malloc is in live mode throughout (:func:`vitzoo.measure.memory._malloc_live`), as in the benchmark's memory
    phase: under glibc's steady thresholds, the freed inputs of a 4,096-token step stay in the heap, fragmented by
    the caches' small blocks (10 MB of swin_cifar's float32 replay, against 1.5 MB live).

    Args:
        calls: ``[op name, args, kwargs]`` entries, tensors as ``{"t": [shape, stride, dtype]}``.
    """
    a = torch.randn(256, 256)
    (a @ a).sum().item()  # the thread pool and MKL's set-up, as the benchmark worker warms them before its baseline
    del a
    file_kb = _file_kb()
    base = _resident_kb(file_kb)
    try:
        for name, args, kwargs in calls:
            namespace, op = name.split("::")
            packet, _, overload = op.partition(".")
            func = getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")
            with torch.no_grad():
                func(*_unspec(args), **{k: _unspec(v) for k, v in kwargs.items()})
        return max(0, _resident_kb(file_kb) - base) / 1024
    finally:
        _malloc_live(False)


def cache_file() -> Path:
    """Where measured cache sizes are kept (``$VITZOO_CACHE`` or ``~/.cache/vitzoo``)."""
    return Path(os.environ.get("VITZOO_CACHE", "~/.cache/vitzoo")).expanduser() / "kernel_cache.json"


def _key(calls: list[list[Any]], threads: int) -> str:
    shapes = hashlib.sha256(json.dumps(calls).encode()).hexdigest()[:16]
    machine = f"{platform.processor() or platform.machine()} {os.cpu_count()} cpus"
    return f"{machine} | {threads} threads | torch {torch.__version__} | {shapes}"


def kernel_cache_mb(calls: list[list[Any]], threads: Optional[int] = None) -> Optional[float]:
    """MiB the kernel caches keep for ``calls`` on this machine (:func:`replay_mb` in a fresh process, then cached);
    0 for no calls, None where it cannot be measured (not Linux with glibc, or the replay failed).

    Args:
        calls: :attr:`KernelShapes.calls` of a training step.
        threads: the torch threads of the measured process (default: this process's).
    """
    if not calls:
        return 0.0
    if _glibc() is None or _proc_status_kb("VmRSS") is None:
        return None
    threads = threads or torch.get_num_threads()
    key, path = _key(calls, threads), cache_file()
    try:
        stored = json.loads(read_regular_text(path))
    except (OSError, ValueError):
        stored = {}
    if key in stored:
        return float(stored[key])
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run([sys.executable, "-m", "vitzoo.measure.kernel_cache"], input=json.dumps(calls),
                          capture_output=True, text=True, env=env, timeout=600)
    try:
        mb = float(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({**stored, key: mb}, indent=1, sort_keys=True))  # whole, never via a link
    except OSError:
        pass  # a read-only cache folder only costs a replay next time
    return mb


if __name__ == "__main__":  # the fresh process of kernel_cache_mb: calls (JSON) on stdin, MiB on stdout
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(replay_mb(json.loads(sys.stdin.read())))
