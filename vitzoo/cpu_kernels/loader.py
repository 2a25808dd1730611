"""vitzoo's compiled CPU kernels (``csrc/*.cpp``): built on first use, cached per CPU, optional.

Each kernel is a ``torch.utils.cpp_extension`` module built with ninja and the C++ compiler (``-O3 -march=native``,
OpenMP for ``at::parallel_for``) the first time a process needs it, about 40 s, and cached under
``~/.cache/torch_extensions`` (or ``TORCH_EXTENSIONS_DIR``) with a hash of the CPU in its name. The kernels run
float32/float64 CPU tensors. Where one cannot be built, a warning names the reason once and the PyTorch path runs;
``VITZOO_CPU_KERNELS=0`` skips every build.

Kernels: ``block_attention`` (:mod:`vitzoo.cpu_kernels.block_kernel`), ``feature_attention``
(:mod:`vitzoo.cpu_kernels.feature_kernel`).
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
from torch import Tensor
from torch.utils import _python_dispatch

CSRC = Path(__file__).parent / "csrc"
ENV = "VITZOO_CPU_KERNELS"  # "0": never build or use a compiled kernel
DTYPES = (torch.float32, torch.float64)
_state: dict[str, Optional[ModuleType]] = {}


def tracing() -> bool:
    """Whether the call is being traced or compiled (``torch.compile``/``torch.export``, ``torch.jit.trace``,
    ONNX export): the fast paths' custom autograd Functions, storage views and compiled kernels then give way
    to plain ops."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


def _cpu_tag() -> str:
    """A short hash of the CPU's model and flags: the build uses ``-march=native``, so one build per CPU."""
    info = ""
    if os.path.exists("/proc/cpuinfo"):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        info = "\n".join(sorted({ln for ln in lines if ln.startswith(("flags", "model name"))}))
    return hashlib.sha1(f"{platform.machine()}\n{info}".encode()).hexdigest()[:10]


def _build(stem: str) -> ModuleType:
    """Builds (or loads the cached build of) ``csrc/<stem>.cpp``; ninja tracks the headers it includes."""
    from torch.utils.cpp_extension import load
    if shutil.which("ninja") is None:  # the ninja wheel's binary, when its environment is not activated
        import ninja
        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])
    flags = ["-O3", "-march=native", "-fopenmp"]  # OpenMP: at::parallel_for runs the (image, head) tasks
    return load(f"vitzoo_{stem}_{_cpu_tag()}", [str(CSRC / f"{stem}.cpp")], extra_cflags=flags,
                extra_ldflags=["-fopenmp"], verbose=False)


def extension(stem: str) -> Optional[ModuleType]:
    """The built kernel ``csrc/<stem>.cpp``, or None (disabled by ``VITZOO_CPU_KERNELS=0``, or its build failed:
    warned once per kernel and process).

    Args:
        stem: the source's name without ``.cpp``.
    """
    if os.environ.get(ENV, "1") == "0":
        return None
    if stem not in _state:
        try:
            _state[stem] = _build(stem)
        except Exception as err:  # no compiler, no ninja, a read-only cache: the PyTorch path still works
            _state[stem] = None
            warnings.warn(f"vitzoo's {stem.replace('_', ' ')} kernel could not be built ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}); using the slower PyTorch path. "
                          f"Set {ENV}=0 to skip the build.", RuntimeWarning, stacklevel=3)
    return _state[stem]


def usable(stem: str, *tensors: Optional[Tensor]) -> bool:
    """Whether kernel ``stem`` runs these tensors: float32/float64 on the CPU, not traced or compiled
    (:func:`tracing`: plain ops are kept there), no dispatch mode watching the aten ops
    (``FlopCounterMode`` and shape recorders see the PyTorch path's ops; a kernel is one opaque call), and it
    could be built."""
    real = [t for t in tensors if t is not None]
    return (not tracing() and all(t.device.type == "cpu" and t.dtype in DTYPES for t in real)
            and _python_dispatch._get_current_dispatch_mode() is None and extension(stem) is not None)
