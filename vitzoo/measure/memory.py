"""Peak memory of a phase (training, evaluation, one benchmark job), a process's memory cap, and out-of-memory
detection."""
from __future__ import annotations

import ctypes
import ctypes.util
import resource
import sys
from pathlib import Path
from typing import Optional

import torch

OOM_TEXTS = ("out of memory", "can't allocate memory", "cannot allocate memory", "std::bad_alloc",
             "not enough memory")


def _proc_status_kb(key: str) -> Optional[int]:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _file_kb() -> int:
    """KiB of the resident set backed by files or shared memory (library code and data pages), 0 if unknown.

    The first call of an operator pages in its code from the torch libraries: resident, but not memory
    that tensors need, and more of it for backends that call more distinct operators.
    """
    return (_proc_status_kb("RssFile") or 0) + (_proc_status_kb("RssShmem") or 0)


def _maxrss_kb() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss // 1024 if sys.platform == "darwin" else rss  # bytes on macOS, KiB on Linux


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
# glibc's dynamic mmap threshold at its ceiling (32 MiB on 64-bit) and the trim threshold it then uses
_STEADY_MMAP, _STEADY_TRIM = 32 * 2 ** 20, 64 * 2 ** 20
_LIVE_MMAP = 128 * 2 ** 10  # glibc's initial threshold: every tensor-sized block gets its own mapping


def _glibc() -> Optional[ctypes.CDLL]:
    """The C library when it is glibc (it has ``mallopt`` and ``malloc_trim``), else None."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc if libc is not None and hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def _malloc_live(live: bool) -> bool:
    """Make resident memory follow live memory (``live``) or restore glibc's steady-state caching.

    Live: blocks of 128 KiB and more are mapped on their own and unmapped when freed, and the free heap
    is returned to the OS now, so the RSS peak is the peak of live tensors (as CUDA's
    ``max_memory_allocated``) rather than of what malloc happened to keep. Steady: the thresholds glibc's
    dynamic tuning reaches after the first large frees, so timed steps do not pay page faults.
    Returns False where the C library is not glibc.
    """
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt(_M_MMAP_THRESHOLD, _LIVE_MMAP if live else _STEADY_MMAP)
    libc.mallopt(_M_TRIM_THRESHOLD, 0 if live else _STEADY_TRIM)
    if live:
        libc.malloc_trim(0)
    return True


def _can_reset_hwm() -> bool:
    """Reset ``VmHWM`` to the current resident size (Linux); ``False`` where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _proc_status_kb("VmHWM") is not None
    except OSError:
        return False


class PeakMemory:
    """Peak memory of a phase, in MiB over the baseline taken at construction.

    CUDA: ``max_memory_allocated`` (reset at :meth:`start`). CPU on Linux: ``VmHWM`` reset through
    ``/proc/self/clear_refs`` at :meth:`start`, baseline ``VmRSS``. Elsewhere: ``ru_maxrss``.

    With ``live`` (benchmark workers) on glibc, :meth:`start` also makes the resident size follow live
    memory until :meth:`peak_mb` (see :func:`_malloc_live`), and the file-backed pages (:func:`_file_kb`:
    library code paged in by an operator's first call) are left out of the peak and the baseline: the phase
    then measures what the tensors need, not what malloc kept or which code ran; allocations cost page
    faults meanwhile, so time nothing inside such a phase.

    Args:
        device: the torch device the phase runs on.
        live: CPU only: measure live memory (untimed phases) rather than the allocator's footprint.
    """

    def __init__(self, device: torch.device, live: bool = False):
        self.device = device
        self.cuda = device.type == "cuda"
        self.live = live and not self.cuda and _glibc() is not None
        if self.cuda:
            torch.cuda.synchronize(device)
            self.base_kb = torch.cuda.memory_allocated(device) // 1024
            self.method = "cuda max_memory_allocated"
        else:
            self.hwm = _can_reset_hwm()
            self.base_kb = _proc_status_kb("VmRSS") if self.hwm else _maxrss_kb()
            self.file_kb = _file_kb() if self.live and self.hwm else 0
            self.method = ("VmHWM (reset per phase) - baseline VmRSS" if self.hwm
                           else "ru_maxrss (process peak) - baseline") + (
                ", live (glibc mmap threshold 128 KiB), file-backed pages excluded" if self.live else "")

    @staticmethod
    def describe(device: str) -> str:
        """How peak memory is measured on ``device`` (``"cpu"`` or ``"cuda"``), in a sentence."""
        if device == "cuda":
            return ("torch.cuda.max_memory_allocated during the phase minus memory allocated before the model "
                    "was built (one process per configuration)")
        live = (" over two untimed steps with glibc's mmap threshold at 128 KiB and its free heap trimmed, so "
                "freed tensors leave the resident set, without file-backed pages (library code paged in by an "
                "operator's first call): parameters + gradients + optimizer state + live activations"
                if _glibc() is not None else ": parameters + gradients + optimizer state + activations + "
                "allocator cache")
        if _can_reset_hwm():
            return ("peak resident set size (VmHWM, reset via /proc/self/clear_refs before each phase) minus the "
                    "resident size after imports, before the model was built (one process per configuration)" + live)
        return ("ru_maxrss (process-lifetime peak RSS) minus the RSS before the model was built "
                "(one process per configuration)")

    def start(self) -> None:
        """Begin a phase: reset the peak (and, with ``live``, switch malloc to live mode)."""
        if self.live:
            _malloc_live(True)
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.hwm:
            _can_reset_hwm()

    def peak_mb(self) -> float:
        """MiB of the phase's peak over the baseline (never negative); ends a ``live`` phase."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device) // 1024
        else:
            peak = _proc_status_kb("VmHWM") if self.hwm else _maxrss_kb()
            if self.file_kb:
                peak -= _file_kb() - self.file_kb  # code paged in during the phase is not tensor memory
        if self.live:
            _malloc_live(False)
        return max(0, peak - self.base_kb) / 1024


def limit_address_space(limit_gb: Optional[float]) -> None:
    """Cap this process's virtual memory at its current size + ``limit_gb`` (CPU workers only).

    Args:
        limit_gb: GiB allowed on top of the current size; ``None`` or 0: no cap.
    """
    if not limit_gb:
        return
    size_kb = _proc_status_kb("VmSize")
    if size_kb is None:
        return
    # slack for thread stacks and malloc arenas created later
    limit = int((size_kb / 2 ** 20 + limit_gb + 2.0) * 2 ** 30)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` means the configuration did not fit in memory.

    Args:
        exc: the exception a job raised.
    """
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc).lower()
    return any(s in text for s in OOM_TEXTS)
