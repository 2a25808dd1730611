"""The machine a measurement ran on: CPU model, git commit, package versions, memory (``environment.json``)."""
from __future__ import annotations

import datetime as _dt
import importlib
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any, Optional

import timm
import torch

from vitzoo.measure.memory import PeakMemory

REFERENCE_PACKAGES = ("performer_pytorch", "linformer", "natten")


def checkout() -> Optional[Path]:
    """The git working tree this vitzoo runs from, or ``None`` for an installed wheel.

    It is the folder holding the imported ``vitzoo`` package when that folder is the top of a git working tree
    (a ``.git`` entry beside the package); an installed package sits in ``site-packages``, which has none.
    """
    top = Path(__file__).resolve().parents[2]  # <top>/vitzoo/measure/environment.py
    return top if (top / ".git").exists() else None


def vitzoo_version() -> Optional[str]:
    """The installed distribution's version (``pip`` metadata); ``None`` when vitzoo runs uninstalled."""
    try:
        return importlib.metadata.version("vitzoo")
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, or what :mod:`platform` knows) with its family/model numbers
    and the vector ISA torch uses, e.g. ``AMD EPYC (family 23 model 49, AVX2)``: virtual machines often show
    only "AMD EPYC", which covers CPUs from Zen 2 (AVX2, bf16 emulated) to Zen 4 (AVX512-BF16)."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    name = info.get("model name") or platform.processor() or platform.machine()
    isa = torch.backends.cpu.get_cpu_capability()
    flags = info.get("flags", "").split()
    if "avx512_bf16" in flags or "amx_bf16" in flags:
        isa += "-BF16"
    ids = f"family {info['cpu family']} model {info['model']}, " if "cpu family" in info and "model" in info else ""
    return f"{name} ({ids}{isa})"


def git_commit() -> Optional[str]:
    """Short commit of the code that runs (:func:`checkout`), ``+dirty`` when tracked files changed; ``None`` for an
    installed wheel or where git is missing."""
    top = checkout()
    if top is None:
        return None
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=top, capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=top,
                               capture_output=True, text=True, timeout=10)
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def mem_available_gb() -> Optional[float]:
    """``MemAvailable`` of ``/proc/meminfo`` in GiB; ``None`` where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2 ** 20
    except OSError:
        pass
    return None


def package_version(module: str) -> Optional[str]:
    """Version of an installed optional package, or ``None`` when it cannot be imported.

    Args:
        module: importable name, e.g. ``"performer_pytorch"``.
    """
    try:
        mod = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        return None
    return str(getattr(mod, "__version__", "installed"))


def _cuda_info() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    return dict(gpu=props.name, gpu_memory_gb=round(props.total_memory / 2 ** 30, 1), cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version(), tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
                float32_matmul_precision=torch.get_float32_matmul_precision())


def load_average() -> Optional[list[float]]:
    """The 1, 5 and 15 minute load averages; ``None`` where the OS has none."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def environment(device: str, threads: Optional[int] = None) -> dict[str, Any]:
    """Versions, CPU/GPU, threads and load of this machine (``environment.json``).

    Args:
        device: ``"cpu"`` or ``"cuda"`` (resolved).
        threads: the ``threads`` option (``None``: torch's default is reported).
    """
    env: dict[str, Any] = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "vitzoo": vitzoo_version(),
        "git_commit": git_commit(),
        "device": device,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": threads or torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "load_average": load_average(),
        "mem_available_gb": mem_available_gb(),
        "memory_method": PeakMemory.describe(device),
        "references": {name: package_version(name) for name in REFERENCE_PACKAGES},
    }
    if env["references"]["natten"]:
        # natten is optional (imported only when installed); False here means its flex-attention fallback
        env["natten_libnatten"] = bool(getattr(importlib.import_module("natten"), "HAS_LIBNATTEN", False))
    if device == "cuda":
        env.update(_cuda_info())
    return env
