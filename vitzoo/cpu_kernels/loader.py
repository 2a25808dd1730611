"""vitzoo's compiled CPU kernels (``csrc/*.cpp``): built on first use, cached per CPU, optional.

Each kernel is a ``torch.utils.cpp_extension`` module built with ninja and the C++ compiler (``-O3 -march=native``,
OpenMP for ``at::parallel_for``) the first time a process needs it, about 40 s, and cached under
``~/.cache/torch_extensions`` (or ``TORCH_EXTENSIONS_DIR``) with a hash of the CPU in its name. One line on
standard error announces a build before it starts; ``python -m vitzoo.cpu_kernels build`` builds every kernel ahead
of time. The kernels run float32/float64 CPU tensors. Where one cannot be built, a warning names the cause (the
compiler's first error line, or the missing tool) once and the PyTorch path runs; with ``CI=true`` a failed build
raises instead, so CI cannot pass on the fallback alone. ``VITZOO_CPU_KERNELS=0`` skips every build.

Kernels: ``block_attention`` (:mod:`vitzoo.cpu_kernels.block_kernel`), ``feature_attention``
(:mod:`vitzoo.cpu_kernels.feature_kernel`).
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
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


def _name(stem: str) -> str:
    """The extension's name: one build per kernel and CPU."""
    return f"vitzoo_{stem}_{_cpu_tag()}"


def _announce(stem: str) -> None:
    """One line on standard error before a kernel is compiled (nothing when its cached build is loaded)."""
    from torch.utils.cpp_extension import _get_build_directory
    name = _name(stem)
    if (Path(_get_build_directory(name, verbose=False)) / f"{name}.so").exists():
        return
    print(f"vitzoo: compiling the {stem.replace('_', ' ')} CPU kernel (about a minute, once per CPU; "
          f"`python -m vitzoo.cpu_kernels build` builds every kernel ahead of time, {ENV}=0 skips them)",
          file=sys.stderr, flush=True)


def cause(err: BaseException) -> str:
    """The line of a failed build that says why: the compiler's first error, or the first line of the message
    (a missing ninja or compiler), never the ninja command line.

    Args:
        err: what the build raised.
    """
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    errors = [ln for ln in lines[1:] if "error" in ln.lower() or "not found" in ln.lower()]
    return f"{type(err).__name__}: {(errors or lines or [''])[0]}"


def _build(stem: str) -> ModuleType:
    """Builds (or loads the cached build of) ``csrc/<stem>.cpp``; ninja tracks the headers it includes."""
    from torch.utils.cpp_extension import load
    _announce(stem)
    if shutil.which("ninja") is None:  # the ninja wheel's binary, when its environment is not activated
        import ninja
        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])
    flags = ["-O3", "-march=native", "-fopenmp"]  # OpenMP: at::parallel_for runs the (image, head) tasks
    return load(_name(stem), [str(CSRC / f"{stem}.cpp")], extra_cflags=flags,
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
            message = f"vitzoo's {stem.replace('_', ' ')} kernel could not be built ({cause(err)})"
            if in_ci():
                raise RuntimeError(f"{message}; CI=true requires every kernel to build") from err
            _state[stem] = None
            warnings.warn(f"{message}; using the slower PyTorch path. Set {ENV}=0 to skip the build.",
                          RuntimeWarning, stacklevel=3)
    return _state[stem]


def in_ci() -> bool:
    """Whether ``CI`` is set to a true value (``true``/``1``/``yes``): a failed build is then an error."""
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def build_all() -> list[str]:
    """Builds every kernel in ``csrc/`` now (what ``python -m vitzoo.cpu_kernels build`` runs); returns the stems.
    Raises the build's cause where one fails."""
    stems = sorted(path.stem for path in CSRC.glob("*.cpp"))
    for stem in stems:
        try:
            _state[stem] = _build(stem)
        except Exception as err:
            raise RuntimeError(f"the {stem.replace('_', ' ')} kernel could not be built ({cause(err)})") from err
    return stems


def usable(stem: str, *tensors: Optional[Tensor]) -> bool:
    """Whether kernel ``stem`` runs these tensors: float32/float64 on the CPU, not traced or compiled
    (:func:`tracing`: plain ops are kept there), no dispatch mode watching the aten ops
    (``FlopCounterMode`` and shape recorders see the PyTorch path's ops; a kernel is one opaque call), and it
    could be built."""
    real = [t for t in tensors if t is not None]
    return (not tracing() and all(t.device.type == "cpu" and t.dtype in DTYPES for t in real)
            and _python_dispatch._get_current_dispatch_mode() is None and extension(stem) is not None)
