"""Model FLOPs utilisation (MFU): achieved multiply-adds per second over the machine's dense matmul peak.

``MFU = analytic MACs of the work × (3 for a training step: forward + backward ≈ 3 forwards) ÷ seconds
÷ peak MACs/s``, as in PaLM (Chowdhery et al. 2022, appendix B) but in multiply-adds, the unit of
every count in vitzoo. The peak is not a datasheet figure: it is measured once per machine, dtype and
thread count by timing a large square matmul (:func:`matmul_peak`) and cached in
``~/.cache/vitzoo/matmul_peak.json`` (``VITZOO_CACHE`` moves it), so a report is a ratio of two
measurements on the same machine. A backend with MFU 0.05 wastes 95 % of what the matmul units could
do: gathers, copies, softmaxes and Python overhead are where its time goes.
"""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Optional

import torch

from vitzoo.fileio import atomic_write_text
from vitzoo.measure.timing import time_fns

PEAK_SIZE = {"cpu": 2048, "cuda": 8192}  # side n of the timed n×n @ n×n matmul (n³ MACs per call)
PEAK_CALLS = 5  # timed calls after two warm-up calls; the fastest call is the peak
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cache_file() -> Path:
    """Where measured peaks are kept (``$VITZOO_CACHE`` or ``~/.cache/vitzoo``)."""
    return Path(os.environ.get("VITZOO_CACHE", "~/.cache/vitzoo")).expanduser() / "matmul_peak.json"


def _machine_key(device: torch.device, dtype: str) -> str:
    """``device name | dtype | threads``: one cached peak per machine, precision and thread count."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{platform.processor() or platform.machine()} {os.cpu_count()} cpus"
    return f"{name} | {dtype} | {torch.get_num_threads()} threads | torch {torch.__version__}"


def _time_matmul(n: int, dtype: torch.dtype, device: torch.device) -> float:
    """Seconds of the fastest of :data:`PEAK_CALLS` calls of ``a @ b`` with ``a, b[n, n]`` (after two warm-up
    calls: allocation, kernel selection), timed by the one timing loop, :func:`vitzoo.measure.timing.time_fns`."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    timing = time_fns({"matmul": lambda: a @ b}, device, warmup=2, repeats=PEAK_CALLS, max_time=0.0, iters=1)
    return timing["matmul"].min


def matmul_peak(device: torch.device | str = "cpu", dtype: str = "fp32", refresh: bool = False) -> float:
    """The dense matmul peak of this machine in multiply-adds per second (measured once, then cached).

    Args:
        device: where the work runs (``cpu`` or ``cuda``).
        dtype: ``fp32``, ``bf16`` or ``fp16``: the precision of the matmuls (``bf16`` for bf16-mixed runs).
            ``fp16`` on the CPU is measured as ``bf16``, the precision Lightning runs ``16-mixed`` in there
            (a CPU fp16 matmul of this size takes seconds).
        refresh: measure even when :func:`cache_file` has a value (and store the new one); the
            benchmark does, on a quiet machine. Training runs use the cached value.
    """
    device = torch.device(device)
    if dtype not in DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not one of {sorted(DTYPES)}")
    if device.type == "cpu" and dtype == "fp16":
        dtype = "bf16"
    key, path = _machine_key(device, dtype), cache_file()
    stored = _read(path)
    if key in stored and not refresh:
        return float(stored[key])
    n = PEAK_SIZE.get(device.type, 2048)
    peak = n ** 3 / _time_matmul(n, DTYPES[dtype], device)
    _write(path, {**_read(path), key: peak})
    return peak


def precision_dtype(precision: Optional[str]) -> str:
    """The matmul dtype of a Lightning ``precision`` or benchmark ``amp`` value (``bf16-mixed`` -> ``bf16``).

    Args:
        precision: e.g. ``32-true``, ``bf16-mixed``, ``16-mixed``, ``bf16``, ``none`` or None.
    """
    p = str(precision or "").lower()
    return "bf16" if p.startswith("bf16") else "fp16" if p.startswith("16") or p.startswith("fp16") else "fp32"


def mfu(macs: float, seconds: float, peak: Optional[float]) -> Optional[float]:
    """``macs / seconds / peak`` (None when any of them is missing or zero).

    Args:
        macs: multiply-adds of the timed work (for training: analytic forward MACs × 3).
        seconds: its time.
        peak: :func:`matmul_peak` of the machine and dtype.
    """
    if not macs or not seconds or not peak:
        return None
    return macs / seconds / peak


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write(path: Path, data: dict) -> None:
    """Write atomically; a read-only cache folder only costs a re-measurement next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True))
    except OSError:
        pass
