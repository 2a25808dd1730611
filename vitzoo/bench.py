"""Accuracy versus throughput: the benchmark and the sweep comparison behind ``scripts/benchmark.py``
and ``scripts/compare.py``.

Benchmark (:func:`run_benchmark`):

* **models**: for each backend × model × image size × batch, training throughput (forward, backward
  and AdamW step), inference throughput (no grad), batch-1 latency, peak memory, parameters and
  fvcore-measured GMACs (with the analytic count beside it).
* **layers**: one attention layer (default C=128, 4 heads, batch 4) at several token counts:
  forward+backward time and peak memory, with the analytic FLOPs ratio to ``global`` beside the
  measured time ratio.
* **references** (optional extras): timm's ``VisionTransformer`` / ``SwinTransformer`` built with the
  same configuration as vitzoo's ``global`` ViT / ``window`` Swin, and the performer-pytorch,
  linformer and natten layers beside vitzoo's ``performer``, ``linformer`` and ``local`` layers.
  Each pair is built in one process and timed in alternating repeats (ABBA order); the result is a
  speed ratio vitzoo/reference (> 1: vitzoo faster).

How things are measured:

* Timing: untimed warm-up calls (at least one, also used to calibrate), then ``repeats`` timed
  blocks of ``iters`` calls each (``iters`` chosen so a block lasts about ``min_time`` seconds);
  the median block gives the number, the fastest and slowest blocks give min/max. On CUDA the
  blocks are timed with CUDA events, on CPU with ``time.perf_counter``.
* Peak memory: every configuration runs in its own Python process (``python -m vitzoo.bench
  --worker``). On CUDA: ``torch.cuda.max_memory_allocated`` during the phase minus what was
  allocated before the model was built. On CPU (Linux): the peak resident set size of the phase
  (``VmHWM`` after resetting it through ``/proc/self/clear_refs``) minus the resident size measured
  after imports and before the model was built. It therefore includes parameters, gradients,
  optimizer state, activations and what the allocator keeps cached; elsewhere ``ru_maxrss`` (the
  process-lifetime peak) minus the same baseline is used and the method says so.
* On CPU a worker runs under an address-space limit (``mem_limit_gb`` over its start-up size), so a
  configuration that does not fit fails with "out of memory" instead of swapping the machine.

Comparison (:func:`compare_runs`): reads a Hydra multirun folder whose jobs wrote ``results.json``
and draws the accuracy/throughput bubble chart with its Pareto front.
"""
from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
RESULT_MARKER = "@@VITZOO_BENCH_RESULT@@"
NOT_INSTALLED = "not installed (pip install -e '.[bench]')"


# --------------------------------------------------------------------------------------------- options

@dataclass
class BenchOptions:
    """Everything a benchmark run depends on (written to ``environment.json``).

    Args:
        mode: ``"all"``, ``"models"`` or ``"layers"``.
        attention: backends to run (``None``: every registered backend).
        models: model variants (``vitzoo.list_models()``).
        img_sizes: input sides; empty = each model's own ``img_size``.
        batches: training/inference batch sizes.
        tokens: token counts of the layer scaling mode (perfect squares: an s×s grid).
        layer_dim, layer_heads, layer_batch, layer_prefix, layer_window: the single layer's
            channels, heads, batch, prefix tokens and natural window side (backends whose window
            option is null use it).
        references: also time the reference implementations (when installed).
        warmup, repeats, min_time, max_time: timing (see the module docstring); ``max_time`` caps
            the seconds one measurement may take by lowering ``repeats`` (never below 3, or below
            ``repeats`` if that is smaller).
        threads: ``torch.set_num_threads`` in every worker (``None``: torch's default).
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        amp: ``"none"`` or ``"bf16"`` (autocast).
        compile: wrap models in ``torch.compile``.
        isolate: one process per configuration (honest peak memory); ``False`` runs in-process.
        timeout: seconds before a configuration's process is stopped.
        mem_limit_gb: CPU address-space budget of a worker on top of its start-up size
            (``None``: 80 % of the memory available when the run starts).
        out: output folder (default ``outputs/benchmark/<timestamp>``).
        seed: torch seed in every worker.
    """

    mode: str = "all"
    attention: Optional[list[str]] = None
    models: list[str] = field(default_factory=lambda: ["vit_cifar", "swin_cifar"])
    img_sizes: list[int] = field(default_factory=list)
    batches: list[int] = field(default_factory=lambda: [64])
    tokens: list[int] = field(default_factory=lambda: [256, 1024, 4096, 16384])
    layer_dim: int = 128
    layer_heads: int = 4
    layer_batch: int = 4
    layer_prefix: int = 0
    layer_window: int = 8
    references: bool = True
    warmup: int = 3
    repeats: int = 5
    min_time: float = 0.5
    max_time: float = 60.0
    threads: Optional[int] = None
    device: str = "auto"
    amp: str = "none"
    compile: bool = False
    isolate: bool = True
    timeout: float = 900.0
    mem_limit_gb: Optional[float] = None
    out: Optional[str] = None
    seed: int = 0

    def __post_init__(self):
        if self.mode not in ("all", "models", "layers"):
            raise ValueError(f"--mode must be all, models or layers (got {self.mode!r})")
        if self.amp not in ("none", "bf16"):
            raise ValueError(f"--amp must be none or bf16 (got {self.amp!r})")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--device must be auto, cpu or cuda (got {self.device!r})")
        for n in self.tokens:
            if math.isqrt(n) ** 2 != n:
                raise ValueError(f"--tokens {n} is not a square: the layer runs on an s x s token grid")
        if self.repeats < 1:
            raise ValueError("--repeats must be at least 1")


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return name


# --------------------------------------------------------------------------------------------- backends

def attention_spec(name: str) -> dict[str, Any]:
    """The backend's default options: ``configs/attention/<name>.yaml`` (what ``attention=<name>``
    composes), or just ``{"name": name}`` (its dataclass defaults) when there is no YAML."""
    import yaml

    path = CONFIGS / "attention" / f"{name}.yaml"
    if path.exists():
        spec = yaml.safe_load(path.read_text()) or {}
        spec.setdefault("name", name)
        return spec
    return {"name": name}


def select_backends(names: Optional[Iterable[str]] = None) -> list[str]:
    """Registered backends (``vitzoo.list_attention()``), or the named subset (unknown names fail)."""
    from vitzoo.attention import list_attention

    known = list_attention()
    if not names:
        return known
    names = list(names)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown attention backend(s) {', '.join(unknown)}; registered: {', '.join(known)}")
    return names


def _model_family(model: str) -> str:
    from vitzoo.models import MODELS

    return MODELS.get(model)[0].family  # unknown model: ConfigError (a ValueError) listing the choices


def _model_img_size(model: str) -> int:
    from vitzoo.models import model_config

    return model_config(model).img_size


# --------------------------------------------------------------------------------------------- environment

def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> Optional[str]:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10)
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _mem_available_gb() -> Optional[float]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2 ** 20
    except OSError:
        pass
    return None


def package_version(module: str) -> Optional[str]:
    """Version of an installed optional package, or ``None`` when it cannot be imported."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        return None
    return str(getattr(mod, "__version__", "installed"))


def environment(device: str, threads: Optional[int] = None) -> dict[str, Any]:
    """Versions, CPU/GPU, threads and load of this machine (``environment.json``)."""
    import torch
    import timm

    import vitzoo

    env: dict[str, Any] = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "vitzoo": vitzoo.__version__,
        "git_commit": _git_commit(),
        "device": device,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": threads or torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "mem_available_gb": _mem_available_gb(),
        "memory_method": PeakMemory.describe(device),
        "references": {"performer_pytorch": package_version("performer_pytorch"),
                       "linformer": package_version("linformer"), "natten": package_version("natten")},
    }
    if env["references"]["natten"]:
        import natten

        env["natten_libnatten"] = bool(getattr(natten, "HAS_LIBNATTEN", False))  # False: flex-attention fallback
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 2 ** 30, 1), cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version(), tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
                   float32_matmul_precision=torch.get_float32_matmul_precision())
    return env


# --------------------------------------------------------------------------------------------- timing

@dataclass
class Timing:
    """Seconds per call of each timed block (one entry per repeat) and calls per block."""

    seconds: list[float]
    iters: int

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def min(self) -> float:
        return min(self.seconds)

    @property
    def max(self) -> float:
        return max(self.seconds)

    def rate(self, items: int) -> tuple[float, float, float]:
        """Items per second: median, min (slowest block), max (fastest block)."""
        return items / self.median, items / self.max, items / self.min


def _time_block(fn: Callable[[], Any], iters: int, device) -> float:
    """Seconds for ``iters`` calls of ``fn`` (CUDA events on GPU, perf_counter on CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return time.perf_counter() - t0


def time_fns(fns: Mapping[str, Callable[[], Any]], device, warmup: int = 3, repeats: int = 5,
             min_time: float = 0.5, max_time: float = 60.0) -> dict[str, Timing]:
    """Time one function, or several in alternating blocks (ABBA order), after a warm-up.

    Args:
        fns: name -> function doing one call (a training step, a forward pass ...).
        device: torch device the functions run on.
        warmup: untimed calls per function (at least 1; the last one calibrates ``iters``); fewer
            when two of them already took ``max_time / 4``.
        repeats: timed blocks per function.
        min_time: target seconds per block (sets the calls per block, the same for all functions).
        max_time: cap on the seconds of all blocks together; lowers ``repeats`` (to 3 at least).
    """
    per_call = {}
    for name, fn in fns.items():
        spent = 0.0
        for _ in range(max(1, warmup)):  # the 2nd call calibrates when the 1st compiled (torch.compile)
            per_call[name] = _time_block(fn, 1, device)
            spent += per_call[name]
            if max_time and spent > max_time / 4 and _ >= 1:  # slow calls: two warm-up calls are enough
                break
    slowest = max(per_call.values())
    iters = max(1, int(min_time / max(slowest, 1e-9))) if min_time > 0 else 1
    block = sum(per_call.values()) * iters
    reps = repeats
    if max_time and block * repeats > max_time:
        reps = max(min(3, repeats), int(max_time / max(block, 1e-9)))
    names = list(fns)
    seconds: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        for name in (names if r % 2 == 0 else names[::-1]):
            seconds[name].append(_time_block(fns[name], iters, device) / iters)
    return {n: Timing(seconds[n], iters) for n in names}


# --------------------------------------------------------------------------------------------- memory

def _proc_status_kb(key: str) -> Optional[int]:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _maxrss_kb() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss // 1024 if sys.platform == "darwin" else rss  # bytes on macOS, KiB on Linux


def _can_reset_hwm() -> bool:
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
    """

    def __init__(self, device):
        import torch

        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            torch.cuda.synchronize(device)
            self.base_kb = torch.cuda.memory_allocated(device) // 1024
            self.method = "cuda max_memory_allocated"
        else:
            self.hwm = _can_reset_hwm()
            self.base_kb = _proc_status_kb("VmRSS") if self.hwm else _maxrss_kb()
            self.method = ("VmHWM (reset per phase) - baseline VmRSS" if self.hwm
                           else "ru_maxrss (process peak) - baseline")

    @staticmethod
    def describe(device: str) -> str:
        if device == "cuda":
            return ("torch.cuda.max_memory_allocated during the phase minus memory allocated before the model "
                    "was built (one process per configuration)")
        if _can_reset_hwm():
            return ("peak resident set size (VmHWM, reset via /proc/self/clear_refs before each phase) minus the "
                    "resident size after imports, before the model was built (one process per configuration): "
                    "parameters + gradients + optimizer state + activations + allocator cache")
        return ("ru_maxrss (process-lifetime peak RSS) minus the RSS before the model was built "
                "(one process per configuration)")

    def start(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.hwm:
            _can_reset_hwm()

    def peak_mb(self) -> float:
        import torch

        if self.cuda:
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device) // 1024
        else:
            peak = _proc_status_kb("VmHWM") if self.hwm else _maxrss_kb()
        return max(0, peak - self.base_kb) / 1024


def _limit_address_space(limit_gb: Optional[float]) -> None:
    """Cap this process's virtual memory at its current size + ``limit_gb`` (CPU workers only)."""
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


def _is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc).lower()
    return any(s in text for s in ("out of memory", "can't allocate memory", "cannot allocate memory",
                                   "std::bad_alloc", "not enough memory"))


# --------------------------------------------------------------------------------------------- references

class ReferenceUnavailable(Exception):
    """The reference package is missing or has no counterpart for this backend/model."""


def timm_reference(model):
    """timm's ``VisionTransformer`` / ``SwinTransformer`` with exactly the configuration of a vitzoo
    ``global`` ViT / ``window`` Swin (same dims, depth, heads, MLP ratio, qkv bias, class token,
    image/patch size, window, dropout and stochastic depth).

    Args:
        model: a vitzoo ``VisionTransformer`` (global attention) or ``SwinTransformer`` (window).
    """
    from vitzoo.models.swin import SwinConfig
    from vitzoo.models.vit import ViTConfig

    cfg = model.cfg
    if isinstance(cfg, ViTConfig):
        from timm.models.vision_transformer import VisionTransformer

        return VisionTransformer(
            img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans, num_classes=cfg.num_classes,
            global_pool=cfg.global_pool, embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads,
            mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias, class_token=cfg.class_token,
            fc_norm=False,  # vitzoo: final norm on all tokens, then pooling (timm's default for 'token')
            drop_rate=cfg.drop_rate, attn_drop_rate=cfg.attn_drop_rate, drop_path_rate=cfg.drop_path_rate)
    if isinstance(cfg, SwinConfig):
        from timm.models.swin_transformer import SwinTransformer

        attn = model.stages[0].blocks[0].attn
        window = getattr(attn.cfg, "window_size", None) or cfg.window_size
        return SwinTransformer(
            img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans, num_classes=cfg.num_classes,
            global_pool="avg", embed_dim=cfg.embed_dim, depths=tuple(cfg.depths), num_heads=tuple(cfg.num_heads),
            window_size=window, mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias, drop_rate=cfg.drop_rate,
            attn_drop_rate=cfg.attn_drop_rate, drop_path_rate=cfg.drop_path_rate)
    raise ReferenceUnavailable(f"no timm counterpart for {type(model).__name__}")


# backend needed for a model-level timm comparison, per model family
MODEL_REFERENCES = {"vit": ("global", "timm VisionTransformer"), "swin": ("window", "timm SwinTransformer")}
# layer-level references: backend -> (importable module, description)
LAYER_REFERENCES = {
    "performer": ("performer_pytorch", "performer-pytorch SelfAttention"),
    "linformer": ("linformer", "linformer LinformerSelfAttention"),
    "local": ("natten", "natten NeighborhoodAttention2D"),
    "dilated": ("natten", "natten NeighborhoodAttention2D (dilated)"),
}


def _opt(cfg: Any, names: Sequence[str], default: Any = None) -> Any:
    """First option of ``cfg`` among ``names`` that is set (backends name their options freely)."""
    for n in names:
        value = getattr(cfg, n, None)
        if value is not None:
            return value
    return default


def layer_reference(name: str, attn, ctx, batch: int) -> tuple[Any, dict[str, Any], Callable]:
    """The reference layer for vitzoo backend ``name``, built like ``attn``.

    Returns:
        ``(module, kwargs it was built with, forward)`` where ``forward(x[B, N, C]) -> [B, N, C]``.

    Raises:
        ReferenceUnavailable: no reference for this backend, or its package is not installed.
    """
    if name not in LAYER_REFERENCES:
        raise ReferenceUnavailable(f"no reference implementation for {name}")
    module_name = LAYER_REFERENCES[name][0]
    if package_version(module_name) is None:
        raise ReferenceUnavailable(NOT_INSTALLED)
    cfg, C, h = attn.cfg, ctx.dim, ctx.num_heads
    H, W = ctx.grid
    n = ctx.num_prefix + H * W
    if name == "performer":
        from performer_pytorch import SelfAttention

        kwargs = dict(dim=C, heads=h, dim_head=C // h, causal=False,
                      nb_features=_opt(cfg, ("num_features", "nb_features", "features", "m")),
                      generalized_attention=str(_opt(cfg, ("kernel",), "softmax")) != "softmax",
                      qkv_bias=ctx.qkv_bias, attn_out_bias=True)
        module = SelfAttention(**kwargs)
        return module, kwargs, module
    if name == "linformer":
        from linformer import LinformerSelfAttention

        share = _opt(cfg, ("share_kv", "sharing"), False)
        kwargs = dict(dim=C, seq_len=n, k=_opt(cfg, ("k", "proj_len", "projected_length"), 256), heads=h,
                      dim_head=C // h, share_kv=bool(share) and share not in ("none", "headwise"),
                      one_kv_head=bool(_opt(cfg, ("one_kv_head",), False)))
        module = LinformerSelfAttention(**kwargs)
        return module, kwargs, module
    # local / dilated -> natten neighbourhood attention on the grid (prefix tokens have no place in it)
    if ctx.num_prefix:
        raise ReferenceUnavailable("natten has no prefix tokens (use --layer-prefix 0)")
    from natten import NeighborhoodAttention2D

    kwargs = dict(embed_dim=C, num_heads=h, kernel_size=_opt(cfg, ("kernel_size", "window_size", "kernel"), 7),
                  dilation=_opt(cfg, ("dilation",), 1), qkv_bias=ctx.qkv_bias)
    module = NeighborhoodAttention2D(**kwargs)

    def forward(x):
        return module(x.reshape(x.shape[0], H, W, C)).reshape(x.shape[0], H * W, C)  # [B, H, W, C] <-> [B, N, C]

    return module, kwargs, forward


def reference_status(name: str) -> str:
    """"installed", :data:`NOT_INSTALLED` or "none" for a layer-level reference."""
    if name not in LAYER_REFERENCES:
        return "none"
    return "installed" if package_version(LAYER_REFERENCES[name][0]) else NOT_INSTALLED


# --------------------------------------------------------------------------------------------- workers

class _Setup:
    """Per-worker torch set-up: device, threads, seed, autocast, and the memory baseline."""

    def __init__(self, job: Mapping[str, Any]):
        import torch

        self.torch = torch
        if job.get("threads"):
            torch.set_num_threads(int(job["threads"]))
        torch.manual_seed(job.get("seed", 0))
        self.device = torch.device(job["device"])
        self.amp = job.get("amp", "none") == "bf16"
        self.compile = bool(job.get("compile", False))
        self.timing = dict(warmup=job.get("warmup", 3), repeats=job.get("repeats", 5),
                           min_time=job.get("min_time", 0.5), max_time=job.get("max_time", 60.0))
        # load every backend module and warm the thread pool so neither counts as the model's memory
        from vitzoo.attention import list_attention

        list_attention()
        a = torch.randn(256, 256, device=self.device)
        (a @ a).sum().item()
        del a
        self.memory = PeakMemory(self.device)

    def autocast(self):
        return self.torch.autocast(device_type=self.device.type, dtype=self.torch.bfloat16, enabled=self.amp)

    def maybe_compile(self, fn):
        return self.torch.compile(fn) if self.compile else fn

    def info(self) -> dict[str, Any]:
        return {"threads": self.torch.get_num_threads(), "device": str(self.device),
                "amp": "bf16" if self.amp else "none", "compile": self.compile, "memory_method": self.memory.method}


class _ModelSteps:
    """Training step, inference pass and batch-1 pass of one classification model on random data."""

    def __init__(self, setup: _Setup, model, batch: int, img_size: int, in_chans: int, num_classes: int):
        torch = setup.torch
        self.setup, self.model = setup, model
        self.net = setup.maybe_compile(model)
        self.x = torch.randn(batch, in_chans, img_size, img_size, device=setup.device)
        self.y = torch.randint(0, num_classes, (batch,), device=setup.device)
        self.x1 = self.x[:1].clone()
        self.opt = None

    def train_mode(self) -> None:
        self.model.train()
        if self.opt is None:
            self.opt = self.setup.torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    def train_step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        with self.setup.autocast():
            loss = self.setup.torch.nn.functional.cross_entropy(self.net(self.x), self.y)
        loss.backward()
        self.opt.step()

    def infer(self) -> None:
        with self.setup.torch.inference_mode(), self.setup.autocast():
            self.net(self.x)

    def infer1(self) -> None:
        with self.setup.torch.inference_mode(), self.setup.autocast():
            self.net(self.x1)


def _error_row(row: dict[str, Any], exc: BaseException, what: str) -> dict[str, Any]:
    from vitzoo.registry import ConfigError

    if isinstance(exc, ConfigError):
        row["status"] = f"cannot build: {exc}"
    elif _is_oom(exc):
        row["status"] = f"out of memory during {what}"
    else:
        row["status"] = f"error during {what}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return row


def model_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """One backend × model × image size × batch (run inside a worker process)."""
    from vitzoo.models import create_model

    setup = _Setup(job)
    row: dict[str, Any] = {"backend": job["backend"], "model": job["model"], "img_size": job["img_size"],
                           "batch": job["batch"], **setup.info()}
    what = "build"
    try:
        model = create_model(job["model"], attention=job["spec"], img_size=job["img_size"]).to(setup.device)
        cfg = model.cfg
        p = cfg.patch_size
        row["tokens"] = (job["img_size"] // p) ** 2 + getattr(model, "num_prefix", 0)
        row["params_m"] = sum(t.numel() for t in model.parameters()) / 1e6
        steps = _ModelSteps(setup, model, job["batch"], job["img_size"], cfg.in_chans, cfg.num_classes)

        what = "inference"
        model.eval()
        setup.memory.start()
        t = time_fns({"m": steps.infer}, setup.device, **setup.timing)["m"]
        row["infer_peak_mb"] = setup.memory.peak_mb()
        row["infer_img_s"], row["infer_img_s_min"], row["infer_img_s_max"] = t.rate(job["batch"])

        what = "training"
        steps.train_mode()
        setup.memory.start()
        t = time_fns({"m": steps.train_step}, setup.device, **setup.timing)["m"]
        row["train_peak_mb"] = setup.memory.peak_mb()
        row["train_img_s"], row["train_img_s_min"], row["train_img_s_max"] = t.rate(job["batch"])
        row["repeats"], row["iters"] = len(t.seconds), t.iters

        what = "batch-1 latency"
        model.eval()
        t = time_fns({"m": steps.infer1}, setup.device, **setup.timing)["m"]
        row["latency_ms"], row["latency_ms_min"], row["latency_ms_max"] = t.median * 1e3, t.min * 1e3, t.max * 1e3
    except Exception as exc:  # noqa: BLE001 - reported in the row
        return _error_row(row, exc, what)
    try:
        from vitzoo.flops import count_flops

        report = count_flops(model, job["img_size"])
        row["gmacs"], row["gmacs_analytic"] = report.measured / 1e9, report.analytic / 1e9
    except Exception as exc:  # noqa: BLE001
        row["note"] = f"fvcore failed: {type(exc).__name__}: {exc}"
    row["status"] = "ok"
    return row


def _time_against_reference(row: dict[str, Any], phase: str, fa, fb, setup) -> None:
    """Time ``fa`` (vitzoo) and ``fb`` (reference) in alternating blocks and record, for ``phase``: both
    median times, the speed ratio vitzoo/reference (reference time / vitzoo time) of the medians, and
    the range of the ratios of the paired (back-to-back) blocks: a noise indicator."""
    t = time_fns({"vitzoo": fa, "reference": fb}, setup.device, **setup.timing)
    row[f"{phase}_ms_vitzoo"] = t["vitzoo"].median * 1e3
    row[f"{phase}_ms_reference"] = t["reference"].median * 1e3
    pairs = [r / v for v, r in zip(t["vitzoo"].seconds, t["reference"].seconds)]
    row[f"{phase}_speed_ratio"] = t["reference"].median / t["vitzoo"].median
    row[f"{phase}_speed_ratio_min"], row[f"{phase}_speed_ratio_max"] = min(pairs), max(pairs)
    row["repeats"], row["iters"] = len(t["vitzoo"].seconds), t["vitzoo"].iters


def model_ref_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """vitzoo model vs its timm twin, timed in alternating blocks (run inside a worker process)."""
    from vitzoo.models import create_model

    setup = _Setup(job)
    row: dict[str, Any] = {"level": "model", "backend": job["backend"], "reference": job["reference"],
                           "case": f"{job['model']} {job['img_size']}px b{job['batch']}", **setup.info()}
    what = "build"
    try:
        vz = create_model(job["model"], attention=job["spec"], img_size=job["img_size"]).to(setup.device)
        ref = timm_reference(vz).to(setup.device)
        row["params_vitzoo"] = sum(t.numel() for t in vz.parameters())
        row["params_reference"] = sum(t.numel() for t in ref.parameters())
        cfg = vz.cfg
        a = _ModelSteps(setup, vz, job["batch"], job["img_size"], cfg.in_chans, cfg.num_classes)
        b = _ModelSteps(setup, ref, job["batch"], job["img_size"], cfg.in_chans, cfg.num_classes)
        b.x, b.y, b.x1 = a.x, a.y, a.x1
        for phase, fa, fb, setup_fn in (
            ("train", a.train_step, b.train_step, lambda s: s.train_mode()),
            ("infer", a.infer, b.infer, lambda s: s.model.eval()),
            ("latency", a.infer1, b.infer1, lambda s: s.model.eval()),
        ):
            what = phase
            setup_fn(a)
            setup_fn(b)
            _time_against_reference(row, phase, fa, fb, setup)
    except ReferenceUnavailable as exc:
        row["status"] = str(exc)
        return row
    except Exception as exc:  # noqa: BLE001
        return _error_row(row, exc, what)
    row["status"] = "ok" if row["params_vitzoo"] == row["params_reference"] else "ok (parameter counts differ)"
    return row


def _layer_host(attn, grid):
    """An ``nn.Module`` calling a mixer as the blocks do: ``attn(x, grid)``."""
    from torch import nn

    class LayerHost(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.grid = attn, tuple(grid)

        def forward(self, x):
            return self.attn(x, self.grid)

    return LayerHost()


def _layer_context(job: Mapping[str, Any]):
    from vitzoo.attention import MixerContext

    s = math.isqrt(job["tokens"])
    return MixerContext(job["dim"], job["heads"], (s, s), job["prefix"], qkv_bias=True, layer_index=0,
                        window=job["window"])


def _fwd_bwd(setup: _Setup, forward: Callable, module, x, g) -> Callable[[], None]:
    def step():
        x.grad = None
        module.zero_grad(set_to_none=True)
        with setup.autocast():
            out = forward(x)
        out.backward(g.to(out.dtype))

    return step


def layer_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """One attention layer at one token count: forward+backward time and peak memory."""
    from vitzoo.attention import build_attention

    setup = _Setup(job)
    torch = setup.torch
    ctx = _layer_context(job)
    row: dict[str, Any] = {"backend": job["backend"], "tokens": job["tokens"], "grid": f"{ctx.grid[0]}x{ctx.grid[1]}",
                           "dim": ctx.dim, "heads": ctx.num_heads, "batch": job["batch"], "prefix": ctx.num_prefix,
                           **setup.info()}
    what = "build"
    try:
        row["gmacs_analytic_global"] = build_attention("global", ctx).flops(ctx.grid) / 1e9
        attn = build_attention(job["spec"], ctx).to(setup.device)
        row["linear_cost"] = bool(getattr(attn, "linear_cost", False))
        row["formula"] = getattr(attn, "formula", "")
        row["gmacs_analytic"] = attn.flops(ctx.grid) / 1e9
        row["flops_ratio"] = row["gmacs_analytic_global"] / row["gmacs_analytic"] if row["gmacs_analytic"] else None
        row["params"] = sum(t.numel() for t in attn.parameters())
        what = "forward+backward"
        attn.train()
        setup.memory.start()
        x = torch.randn(job["batch"], ctx.num_prefix + ctx.grid[0] * ctx.grid[1], ctx.dim, device=setup.device,
                        requires_grad=True)
        g = torch.randn_like(x)
        forward = setup.maybe_compile(_layer_host(attn, ctx.grid))
        t = time_fns({"m": _fwd_bwd(setup, forward, attn, x, g)}, setup.device, **setup.timing)["m"]
        row["peak_mb"] = setup.memory.peak_mb()
        row["ms"], row["ms_min"], row["ms_max"] = t.median * 1e3, t.min * 1e3, t.max * 1e3
        row["repeats"], row["iters"] = len(t.seconds), t.iters
    except Exception as exc:  # noqa: BLE001
        return _error_row(row, exc, what)
    row["status"] = "ok"
    return row


def layer_ref_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """vitzoo layer vs the reference package's layer at one token count, alternating blocks."""
    from vitzoo.attention import build_attention

    setup = _Setup(job)
    torch = setup.torch
    ctx = _layer_context(job)
    row: dict[str, Any] = {"level": "layer", "backend": job["backend"],
                           "case": f"{job['tokens']} tokens C={ctx.dim} h={ctx.num_heads} b{job['batch']}",
                           "tokens": job["tokens"], "reference": LAYER_REFERENCES.get(job["backend"], ("", ""))[1],
                           **setup.info()}
    what = "build"
    try:
        attn = build_attention(job["spec"], ctx).to(setup.device)
        ref, kwargs, ref_forward = layer_reference(job["backend"], attn, ctx, job["batch"])
        ref = ref.to(setup.device)
        row["reference_kwargs"] = json.dumps(kwargs, default=str)
        row["params_vitzoo"] = sum(t.numel() for t in attn.parameters())
        row["params_reference"] = sum(t.numel() for t in ref.parameters())
        attn.train()
        ref.train()
        x = torch.randn(job["batch"], ctx.num_prefix + ctx.grid[0] * ctx.grid[1], ctx.dim, device=setup.device,
                        requires_grad=True)
        g = torch.randn_like(x)
        what = "forward+backward"
        fa = _fwd_bwd(setup, setup.maybe_compile(_layer_host(attn, ctx.grid)), attn, x, g)
        fb = _fwd_bwd(setup, setup.maybe_compile(ref_forward), ref, x, g)
        phase, status = "fwd_bwd", "ok"
        try:
            fb()
        except NotImplementedError as exc:  # e.g. natten's CPU path (flex attention) has no backward
            phase, status = "fwd", f"ok (forward only: {str(exc).splitlines()[0][:120]})"
            what = "forward"
            host, x_ng = _layer_host(attn, ctx.grid), x.detach()

            def fa():
                with torch.inference_mode(), setup.autocast():
                    host(x_ng)

            def fb():
                with torch.inference_mode(), setup.autocast():
                    ref_forward(x_ng)
        _time_against_reference(row, phase, fa, fb, setup)
    except ReferenceUnavailable as exc:
        row["status"] = str(exc)
        return row
    except Exception as exc:  # noqa: BLE001
        return _error_row(row, exc, what)
    row["status"] = status
    return row


JOBS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "model": model_job, "model_ref": model_ref_job, "layer": layer_job, "layer_ref": layer_ref_job}


def _worker_main() -> None:
    """``python -m vitzoo.bench --worker``: read one job (JSON) on stdin, print its row (JSON)."""
    job = json.loads(sys.stdin.read())
    if job.get("device") == "cpu":
        _limit_address_space(job.get("mem_limit_gb"))
    try:
        row = JOBS[job["kind"]](job)
    except Exception as exc:  # noqa: BLE001 - a broken job still answers
        traceback.print_exc()
        row = {"status": f"error: {type(exc).__name__}: {exc}"}
    sys.stdout.write("\n" + RESULT_MARKER + json.dumps(row, default=str) + "\n")
    sys.stdout.flush()


def run_job(job: Mapping[str, Any], isolate: bool = True, timeout: float = 1800.0) -> dict[str, Any]:
    """Run one job in a fresh process (``isolate``) or in this one; never raises."""
    if not isolate:
        try:
            return JOBS[job["kind"]](job)
        except Exception as exc:  # noqa: BLE001
            return {"status": f"error: {type(exc).__name__}: {exc}"}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    if job.get("threads"):
        env["OMP_NUM_THREADS"] = str(job["threads"])
    try:
        proc = subprocess.run([sys.executable, "-m", "vitzoo.bench", "--worker"], input=json.dumps(job), env=env,
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER):])
    last = next((ln for ln in reversed(proc.stderr.splitlines()) if ln.strip()), "")
    if proc.returncode in (-9, 137):
        return {"status": "killed (SIGKILL: out of memory?)"}
    return {"status": f"worker failed (exit {proc.returncode}): {last[:300]}"}


# --------------------------------------------------------------------------------------------- orchestration

MODEL_COLUMNS = ["backend", "model", "img_size", "batch", "tokens", "status", "train_img_s", "train_img_s_min",
                 "train_img_s_max", "infer_img_s", "infer_img_s_min", "infer_img_s_max", "latency_ms", "latency_ms_min",
                 "latency_ms_max", "train_peak_mb", "infer_peak_mb", "params_m", "gmacs", "gmacs_analytic", "repeats",
                 "iters", "threads", "device", "amp", "compile", "memory_method", "note"]
LAYER_COLUMNS = ["backend", "tokens", "grid", "status", "ms", "ms_min", "ms_max", "peak_mb", "gmacs_analytic",
                 "gmacs_analytic_global", "flops_ratio", "time_ratio", "efficiency", "linear_cost", "formula", "params",
                 "dim", "heads", "batch", "prefix", "repeats", "iters", "threads", "device", "amp", "compile",
                 "memory_method"]
SPEED_RATIOS = ("train_speed_ratio", "infer_speed_ratio", "latency_speed_ratio", "fwd_bwd_speed_ratio",
                "fwd_speed_ratio")
REF_COLUMNS = ["level", "backend", "case", "reference", "status", *SPEED_RATIOS, "train_ms_vitzoo",
               "train_ms_reference", "infer_ms_vitzoo", "infer_ms_reference", "latency_ms_vitzoo",
               "latency_ms_reference",
               "fwd_bwd_ms_vitzoo", "fwd_bwd_ms_reference", "fwd_ms_vitzoo", "fwd_ms_reference", "params_vitzoo",
               "params_reference", "reference_kwargs", "repeats", "iters",
               "threads", "device"]
GOAL_COLUMNS = ["goal", "measured", "target", "status"]


def _common(opts: BenchOptions, device: str, mem_limit_gb: Optional[float]) -> dict[str, Any]:
    return dict(device=device, threads=opts.threads, amp=opts.amp, compile=opts.compile, warmup=opts.warmup,
                repeats=opts.repeats, min_time=opts.min_time, max_time=opts.max_time, seed=opts.seed,
                mem_limit_gb=mem_limit_gb)


def _log(msg: str) -> None:
    print(msg, flush=True)


def run_benchmark(opts: BenchOptions, log: Callable[[str], None] = _log) -> dict[str, Any]:
    """Run the benchmark described by ``opts`` and write its tables, chart and environment.

    Returns:
        ``{"out": folder, "models": rows, "layers": rows, "references": rows, "goals": rows, "environment": env}``.
    """
    device = resolve_device(opts.device)
    backends = select_backends(opts.attention)
    mem_limit = opts.mem_limit_gb
    if mem_limit is None and device == "cpu":
        avail = _mem_available_gb()
        mem_limit = round(0.8 * avail, 1) if avail else None
    out = Path(opts.out or ROOT / "outputs" / "benchmark" / _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S"))
    out.mkdir(parents=True, exist_ok=True)
    env = environment(device, opts.threads)
    env["options"] = asdict(opts)
    env["backends"] = backends
    env["mem_limit_gb"] = mem_limit
    if not opts.isolate:
        env["memory_method"] = "in-process (--no-isolate): " + env["memory_method"].replace(
            " (one process per configuration)", "") + "; earlier configurations' cached memory is not counted"
    common = _common(opts, device, mem_limit)
    log(f"vitzoo benchmark -> {out}\n  device {device} ({env.get('gpu', env['cpu_model'])}), threads "
        f"{env['torch_threads']}, load {env['load_average']}, backends: {', '.join(backends)}")
    t_start = time.time()
    models: list[dict] = []
    layers: list[dict] = []
    refs: list[dict] = []

    stream = out / "rows.jsonl"  # every row as soon as it exists: an interrupted run keeps what it measured

    def run(job: dict[str, Any]) -> dict[str, Any]:
        row = run_job({**common, **job}, opts.isolate, opts.timeout)
        for k in ("backend", "model", "img_size", "batch", "tokens"):
            if k in job and k not in row:
                row[k] = job[k]
        with open(stream, "a") as f:
            f.write(json.dumps({"kind": job["kind"], **row}, default=str) + "\n")
        return row

    if opts.mode in ("all", "models"):
        for model in opts.models:
            family = _model_family(model)
            for img in opts.img_sizes or [_model_img_size(model)]:
                for batch in opts.batches:
                    for backend in backends:
                        row = run(dict(kind="model", backend=backend, spec=attention_spec(backend), model=model,
                                       img_size=img, batch=batch))
                        models.append(row)
                        log(f"  model {model:11s} {img}px b{batch} {backend:14s} {_brief_model(row)}")
                    ref_backend, ref_name = MODEL_REFERENCES.get(family, (None, None))
                    if opts.references and ref_backend in backends:
                        row = run(dict(kind="model_ref", backend=ref_backend, spec=attention_spec(ref_backend),
                                       model=model, img_size=img, batch=batch, reference=ref_name))
                        row.setdefault("level", "model")
                        row.setdefault("case", f"{model} {img}px b{batch}")
                        row.setdefault("reference", ref_name)
                        refs.append(row)
                        log(f"  ref   {model:11s} {img}px b{batch} vs {ref_name}: {_brief_ref(row)}")

    if opts.mode in ("all", "layers"):
        layer_common = dict(dim=opts.layer_dim, heads=opts.layer_heads, batch=opts.layer_batch,
                            prefix=opts.layer_prefix, window=opts.layer_window)
        for backend in backends:
            spec = attention_spec(backend)
            stop_reason = None
            for tokens in sorted(opts.tokens):
                if stop_reason:
                    row = {"backend": backend, "tokens": tokens, "status": f"skipped: {stop_reason} at fewer tokens"}
                else:
                    row = run(dict(kind="layer", backend=backend, spec=spec, tokens=tokens, **layer_common))
                    if row["status"].startswith(("out of memory", "timed out", "killed")):
                        stop_reason = row["status"].split(" during")[0]
                layers.append(row)
                log(f"  layer {backend:14s} {tokens:6d} tokens: {_brief_layer(row)}")
                if opts.references and backend in LAYER_REFERENCES and row["status"] == "ok":
                    if reference_status(backend) != "installed":
                        continue  # one "not installed" line per backend, added below
                    ref = run(dict(kind="layer_ref", backend=backend, spec=spec, tokens=tokens, **layer_common))
                    ref.setdefault("level", "layer")
                    ref.setdefault("case", f"{tokens} tokens C={opts.layer_dim} h={opts.layer_heads} "
                                           f"b{opts.layer_batch}")
                    ref.setdefault("reference", LAYER_REFERENCES[backend][1])
                    refs.append(ref)
                    log(f"  ref   {backend:14s} {tokens:6d} tokens vs {ref['reference']}: {_brief_ref(ref)}")
        _add_layer_ratios(layers)
        if opts.references:  # one line for a backend whose reference is not installed or whose layer never ran
            seen = {r["backend"] for r in refs if r.get("level") == "layer"}
            for backend in backends:
                if backend in LAYER_REFERENCES and backend not in seen:
                    refs.append({"level": "layer", "backend": backend, "reference": LAYER_REFERENCES[backend][1],
                                 "status": reference_status(backend) if reference_status(backend) != "installed"
                                 else "vitzoo layer did not run"})
        for name in LAYER_REFERENCES:  # a reference whose backend does not exist (yet)
            if opts.references and name not in select_backends() and opts.attention is None:
                refs.append({"level": "layer", "backend": name, "reference": LAYER_REFERENCES[name][1],
                             "status": "backend not registered"})

    goals = goal_rows(models, layers, refs, opts)
    env["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    env["wall_seconds"] = round(time.time() - t_start, 1)
    result = {"out": str(out), "models": models, "layers": layers, "references": refs, "goals": goals,
              "environment": env}
    write_outputs(result, out)
    log("\n" + markdown_table(goals, GOAL_COLUMNS))
    log(f"\nwritten: {', '.join(sorted(p.name for p in out.iterdir()))} in {out}")
    return result


def _brief_model(row: Mapping[str, Any]) -> str:
    if row.get("status") != "ok":
        return row.get("status", "?")
    return (f"train {row['train_img_s']:.1f} img/s, infer {row['infer_img_s']:.1f} img/s, "
            f"b1 {row['latency_ms']:.2f} ms, peak {row['train_peak_mb']:.0f} MB")


def _brief_layer(row: Mapping[str, Any]) -> str:
    if row.get("status") != "ok":
        return row.get("status", "?")
    return f"{row['ms']:.2f} ms fwd+bwd, peak {row['peak_mb']:.0f} MB"


def _brief_ref(row: Mapping[str, Any]) -> str:
    if not str(row.get("status", "")).startswith("ok"):
        return row.get("status", "?")
    parts = [f"{k[:-len('_speed_ratio')].replace('_', '+')} x{row[k]:.2f}" for k in SPEED_RATIOS if k in row]
    return "vitzoo/reference speed " + ", ".join(parts)


def _add_layer_ratios(layers: list[dict[str, Any]]) -> None:
    """Measured speedup over ``global`` (``time_ratio``) and its share of the analytic one (``efficiency``)."""
    global_ms = {r["tokens"]: r["ms"] for r in layers if r.get("backend") == "global" and r.get("status") == "ok"}
    for r in layers:
        if r.get("status") == "ok" and r["tokens"] in global_ms:
            r["time_ratio"] = global_ms[r["tokens"]] / r["ms"]
            if r.get("flops_ratio"):
                r["efficiency"] = r["time_ratio"] / r["flops_ratio"]


GOAL_TOKENS = 4096
GOAL_EFFICIENCY = 0.8


def goal_rows(models: list[dict], layers: list[dict], refs: list[dict], opts: BenchOptions) -> list[dict[str, Any]]:
    """The issue's goals, each met / missed / not measured (reported, never asserted)."""
    goals: list[dict[str, Any]] = []
    for family, (backend, ref_name) in MODEL_REFERENCES.items():
        rows = [r for r in refs if r.get("level") == "model" and r.get("backend") == backend]
        for phase in ("train", "infer"):
            goal = f"vitzoo {family} `{backend}` {phase} speed vs {ref_name}"
            if not rows:
                why = ("--no-references" if not opts.references else "models mode off" if opts.mode == "layers"
                       else f"needs a {family}_* model and the {backend} backend")
                goals.append({"goal": goal, "measured": "", "target": ">= 1.00", "status": f"not measured ({why})"})
            for r in rows:
                v = r.get(f"{phase}_speed_ratio")
                spread = (f" ({r[f'{phase}_speed_ratio_min']:.2f}–{r[f'{phase}_speed_ratio_max']:.2f})"
                          if r.get(f"{phase}_speed_ratio_min") is not None else "")
                goals.append({"goal": f"{goal} ({r.get('case', '')})",
                              "measured": "" if v is None else f"{v:.2f}{spread}",
                              "target": ">= 1.00",
                              "status": ("met" if v >= 1.0 else "missed") if v is not None
                              else f"not measured: {r.get('status')}"})
    at = [r for r in layers if r.get("tokens") == GOAL_TOKENS]
    if not at:
        goals.append({"goal": f"linear-cost backends at {GOAL_TOKENS} tokens: speedup over global >= "
                              f"{GOAL_EFFICIENCY} x analytic FLOPs ratio", "measured": "", "target": "",
                      "status": f"not measured ({GOAL_TOKENS} not in --tokens or layers mode off)"})
    g = next((r for r in at if r.get("backend") == "global"), None)
    for r in at:
        if not r.get("linear_cost"):
            continue
        goal = f"`{r['backend']}` at {GOAL_TOKENS} tokens: measured speedup / analytic FLOPs ratio"
        if r.get("efficiency") is not None:
            goals.append({"goal": goal, "measured": f"{r['efficiency']:.2f} ({r['time_ratio']:.2f}x of "
                                                     f"{r['flops_ratio']:.2f}x)",
                          "target": f">= {GOAL_EFFICIENCY}", "status": "met" if r["efficiency"] >= GOAL_EFFICIENCY
                          else "missed"})
        else:
            why = r.get("status") if r.get("status") != "ok" else f"global: {g.get('status') if g else 'not run'}"
            goals.append({"goal": goal, "measured": "", "target": f">= {GOAL_EFFICIENCY}",
                          "status": f"not measured: {why}"})
    return goals


# --------------------------------------------------------------------------------------------- writing

def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v == 0:
            return "0"
        a = abs(v)
        return f"{v:.0f}" if a >= 1000 else f"{v:.1f}" if a >= 100 else f"{v:.2f}" if a >= 1 else f"{v:.3g}"
    return str(v)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
                   headers: Optional[Mapping[str, str]] = None) -> str:
    """A GitHub Markdown table of ``rows`` restricted to ``columns`` (``|`` in cells escaped)."""
    headers = headers or {}
    head = [headers.get(c, c) for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c)).replace("|", "\\|").replace("\n", " ") for c in columns) + " |")
    return "\n".join(lines)


def write_csv(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], path: Path) -> None:
    """CSV with ``columns`` first and any other keys found in ``rows`` after them."""
    extra = sorted({k for r in rows for k in r} - set(columns))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns) + extra, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if v is None else v) for k, v in r.items()})


def _range(r: Mapping[str, Any], key: str) -> str:
    v = r.get(key)
    if v is None:
        return ""
    lo, hi = r.get(f"{key}_min"), r.get(f"{key}_max")
    return f"{_fmt(v)} ({_fmt(lo)}–{_fmt(hi)})" if lo is not None and hi is not None else _fmt(v)


def _model_md(rows: Sequence[Mapping[str, Any]]) -> str:
    view = [{**r, "train": _range(r, "train_img_s"), "infer": _range(r, "infer_img_s"),
             "latency": _range(r, "latency_ms")} for r in rows]
    cols = ["backend", "model", "img_size", "batch", "status", "train", "infer", "latency", "train_peak_mb",
            "infer_peak_mb", "params_m", "gmacs", "gmacs_analytic"]
    return markdown_table(view, cols, {"img_size": "img", "train": "train img/s (min–max)",
                                       "infer": "infer img/s (min–max)", "latency": "batch-1 ms (min–max)",
                                       "train_peak_mb": "train peak MB", "infer_peak_mb": "infer peak MB",
                                       "params_m": "params M", "gmacs": "GMACs (fvcore)",
                                       "gmacs_analytic": "GMACs (analytic)"})


def _layer_md(rows: Sequence[Mapping[str, Any]]) -> str:
    view = [{**r, "time": _range(r, "ms")} for r in rows]
    cols = ["backend", "tokens", "status", "time", "peak_mb", "gmacs_analytic", "flops_ratio", "time_ratio",
            "efficiency", "formula"]
    return markdown_table(view, cols, {"time": "fwd+bwd ms (min–max)", "peak_mb": "peak MB",
                                       "gmacs_analytic": "GMACs/img (analytic)",
                                       "flops_ratio": "FLOPs ratio global/backend",
                                       "time_ratio": "time ratio global/backend",
                                       "efficiency": "time ratio / FLOPs ratio"})


def _ref_md(rows: Sequence[Mapping[str, Any]]) -> str:
    rows = [{**r, **{k: _range(r, k) for k in SPEED_RATIOS}} for r in rows]
    cols = ["level", "backend", "case", "reference", "status", *SPEED_RATIOS, "params_vitzoo", "params_reference"]
    return markdown_table(rows, cols, {"train_speed_ratio": "train × (paired min–max)",
                                       "infer_speed_ratio": "infer ×",
                                       "latency_speed_ratio": "batch-1 ×", "fwd_bwd_speed_ratio": "fwd+bwd ×",
                                       "fwd_speed_ratio": "fwd only ×", "params_vitzoo": "params vitzoo",
                                       "params_reference": "params reference"})


def plot_scaling(layers: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> Optional[Path]:
    """Log-log time (and peak memory) versus tokens, one line per backend. ``None`` if nothing ran."""
    ok = [r for r in layers if r.get("status") == "ok"]
    if not ok:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(14, 5.5))
    backends = sorted({r["backend"] for r in ok}, key=lambda b: (b != "global", b))
    cmap, markers = plt.get_cmap("tab20"), "os^vD<>ph*Xd"
    for i, b in enumerate(backends):
        pts = sorted((r["tokens"], r["ms"], r.get("peak_mb")) for r in ok if r["backend"] == b)
        style = dict(color="black", lw=2.5, marker="o") if b == "global" else dict(
            color=cmap(i % 20), lw=1.3, marker=markers[i % len(markers)], ls="-" if i < 10 else "--")
        ax_t.plot([p[0] for p in pts], [p[1] for p in pts], ms=4, label=b, **style)
        mem = [(p[0], p[2]) for p in pts if p[2]]
        if mem:
            ax_m.plot([p[0] for p in mem], [p[1] for p in mem], ms=4, label=b, **style)
    ticks = sorted({r["tokens"] for r in layers})
    for ax, ylabel in ((ax_t, "forward+backward time (ms)"), (ax_m, "peak memory over baseline (MB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(ticks)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("tokens N")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_m.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    failed = sorted({f"{r['backend']}@{r['tokens']}" for r in layers if r.get("status") != "ok"})
    if failed:
        fig.text(0.01, 0.01, "not run: " + ", ".join(failed)[:300], fontsize=7)
    fig.suptitle(title or "one attention layer: time and memory versus tokens")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_outputs(result: Mapping[str, Any], out: Path) -> None:
    """``environment.json``, ``results.json``, ``{models,layers,references,goals}.{csv,md}``,
    ``layer_scaling.png`` and ``report.md`` (all tables in one page) under ``out``."""
    env = result["environment"]
    (out / "environment.json").write_text(json.dumps(env, indent=2, default=str))
    (out / "results.json").write_text(json.dumps({k: v for k, v in result.items() if k != "out"}, indent=2,
                                                 default=str))
    sections = []
    head = (f"# vitzoo benchmark {env['date']}\n\n"
            f"device **{env['device']}** ({env.get('gpu') or env['cpu_model']}), torch {env['torch']}, "
            f"{env['torch_threads']} threads, load average {env['load_average']} → {env.get('load_average_end')}, "
            f"amp {env['options']['amp']}, compile {env['options']['compile']}. Numbers are medians over "
            f"repeats (min–max in brackets), warm-up excluded. Peak memory: {env['memory_method']}.\n")
    sections.append(head)
    for name, columns, md in (("models", MODEL_COLUMNS, _model_md), ("layers", LAYER_COLUMNS, _layer_md),
                              ("references", REF_COLUMNS, _ref_md), ("goals", GOAL_COLUMNS, None)):
        rows = result[name]
        if not rows and name != "goals":
            continue
        write_csv(rows, columns, out / f"{name}.csv")
        table = md(rows) if md else markdown_table(rows, columns)
        (out / f"{name}.md").write_text(table + "\n")
        sections.append(f"## {name}\n\n{table}\n")
    if result["layers"]:
        png = plot_scaling(result["layers"], out / "layer_scaling.png")
        if png:
            sections.append("![layer scaling](layer_scaling.png)\n")
    (out / "report.md").write_text("\n".join(sections))


# --------------------------------------------------------------------------------------------- compare

RUN_COLUMNS = ["attention", "model", "data", "status", "best_val_acc", "best_val_acc5", "val_loss",
               "train_images_per_s", "infer_images_per_s", "peak_memory_mb", "params", "gmacs", "gmacs_analytic",
               "epochs", "overrides", "run_dir", "error"]


def find_run_dirs(folder: Path) -> list[Path]:
    """Job folders of a multirun: every folder under ``folder`` holding ``.hydra/`` or ``results.json``."""
    folder = Path(folder)
    found = {p.parent for p in folder.rglob(".hydra") if p.is_dir()}
    found |= {p.parent for p in folder.rglob("results.json")}
    found = {d for d in found if "compare" not in d.relative_to(folder).parts}

    def key(p: Path):
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p.relative_to(folder)))]

    return sorted(found, key=key)


def _read_overrides(run: Path) -> list[str]:
    import yaml

    path = run / ".hydra" / "overrides.yaml"
    try:
        return [str(o) for o in (yaml.safe_load(path.read_text()) or [])]
    except (OSError, yaml.YAMLError):
        return []


def _choices(run: Path) -> dict[str, str]:
    """Config-group choices of a job: ``hydra.runtime.choices`` in ``.hydra/hydra.yaml``, then overrides."""
    import yaml

    choices: dict[str, str] = {}
    try:
        hy = yaml.safe_load((run / ".hydra" / "hydra.yaml").read_text()) or {}
        runtime_choices = hy.get("hydra", {}).get("runtime", {}).get("choices") or {}
        choices.update({str(k): str(v) for k, v in runtime_choices.items()})
    except (OSError, yaml.YAMLError, AttributeError):
        pass
    for o in _read_overrides(run):
        key, sep, value = o.lstrip("+~").partition("=")
        if sep and "." not in key:
            choices[key] = value
    return choices


def read_run(run: Path, root: Optional[Path] = None) -> dict[str, Any]:
    """One job's row: its ``results.json`` (or why it has none) plus its config-group choices."""
    run = Path(run)
    choices = _choices(run)
    if not choices.get("model"):  # job folders are named <num>_<model>_<attention> by configs/hydra/default.yaml
        from vitzoo.models import list_models

        choices["model"] = next((m for m in list_models() if f"_{m}_" in f"_{run.name}_"), None)
    row: dict[str, Any] = {"attention": choices.get("attention"), "model": choices.get("model"),
                           "data": choices.get("data"),
                           "overrides": " ".join(o for o in _read_overrides(run)
                                                 if not o.startswith(("experiment=", "hydra."))),
                           "run_dir": str(run.relative_to(root)) if root else str(run)}
    path = run / "results.json"
    if not path.exists():
        row["status"] = "missing results.json"
        return row
    try:
        res = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        row["status"] = f"unreadable results.json ({type(exc).__name__})"
        return row
    for k in RUN_COLUMNS:
        if k in res and k not in ("overrides", "run_dir"):
            if k in ("attention", "model", "data") and not res[k]:
                continue
            row[k] = res[k]
    for k in ("attention", "model", "data"):  # results.json may hold dicts ({"name": ...})
        if isinstance(row.get(k), Mapping):
            row[k] = row[k].get("name") or choices.get(k)
    status = str(res.get("status", "unknown"))
    row["status"] = {"running": "unfinished (running)"}.get(status, status)
    for k in ("best_val_acc", "best_val_acc5"):
        row[f"{k}_pct"] = None if row.get(k) is None else 100.0 * float(row[k])
    return row


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated when both coordinates are better larger, sorted by x."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1]))
    front, best_y = [], -math.inf
    for i in order:
        if points[i][1] > best_y:
            front.append(i)
            best_y = points[i][1]
    return sorted(front, key=lambda i: points[i][0])


def plot_bubbles(rows: Sequence[Mapping[str, Any]], path: Path, x: str = "train_images_per_s",
                 title: str = "") -> Path:
    """Accuracy versus throughput: one labelled bubble per run (area ∝ peak memory), Pareto front drawn.

    Runs that are not finished or lack the numbers are listed under the chart instead.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [r for r in rows if r.get("status") == "finished" and _finite(r.get(x)) and _finite(r.get("best_val_acc"))]
    left_out = [f"{r.get('attention')} ({r.get('status')})" for r in rows if r not in pts]
    models = sorted({str(r.get("model")) for r in pts})
    fig, ax = plt.subplots(figsize=(12, 6.5))
    mems = [float(r["peak_memory_mb"]) for r in pts if _finite(r.get("peak_memory_mb"))]
    top = max(mems) if mems else 1.0
    cmap = plt.get_cmap("tab10")
    for r in pts:
        mem = r.get("peak_memory_mb")
        area = 40 + 1500 * (float(mem) / top if _finite(mem) and top > 0 else 0.1)
        color = cmap(models.index(str(r.get("model"))) % 10)
        ax.scatter(r[x], 100 * r["best_val_acc"], s=area, color=color, alpha=0.45, edgecolors="black", linewidths=0.6)
        label = r.get("attention") if len(models) == 1 else f"{r.get('attention')} ({r.get('model')})"
        ax.annotate(str(label), (r[x], 100 * r["best_val_acc"]), fontsize=8, ha="center", va="center")
    if pts:
        xy = [(float(r[x]), 100 * float(r["best_val_acc"])) for r in pts]
        front = pareto_front(xy)
        ax.plot([xy[i][0] for i in front], [xy[i][1] for i in front], "--", color="crimson", lw=1.5,
                label="Pareto front (faster and more accurate)")
        if max(p[0] for p in xy) / max(min(p[0] for p in xy), 1e-9) > 8:
            ax.set_xscale("log")
        for mb in ([top / 4, top] if mems else []):  # bubble-size key
            ax.scatter([], [], s=40 + 1500 * mb / top, color="grey", alpha=0.3, edgecolors="black",
                       label=f"peak memory {mb:.0f} MB")
        for m in models if len(models) > 1 else []:
            ax.scatter([], [], s=60, color=cmap(models.index(m) % 10), alpha=0.6, label=m)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), labelspacing=3.5, borderpad=1.5,
                  handletextpad=2.0, frameon=False)
        ax.margins(0.12)
    else:
        ax.text(0.5, 0.5, "no finished run with accuracy and throughput", ha="center", transform=ax.transAxes)
    ax.set_xlabel({"train_images_per_s": "training throughput (images/s)",
                   "infer_images_per_s": "inference throughput (images/s)"}.get(x, x))
    ax.set_ylabel("best validation accuracy (%)")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title or "accuracy versus throughput (bubble area: peak memory)")
    if left_out:
        fig.text(0.01, 0.005, "not plotted: " + ", ".join(left_out)[:400], fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _sort_runs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def key(r):
        acc = r.get("best_val_acc")
        finished = r.get("status") == "finished"
        return (not finished, -(acc if _finite(acc) else -1.0), str(r.get("attention")))

    return sorted(rows, key=key)


def _runs_md(rows: Sequence[Mapping[str, Any]]) -> str:
    view = [{**r, "params_m": r["params"] / 1e6 if _finite(r.get("params")) else None} for r in rows]
    cols = ["attention", "model", "data", "status", "best_val_acc_pct", "best_val_acc5_pct", "train_images_per_s",
            "infer_images_per_s", "peak_memory_mb", "params_m", "gmacs", "epochs", "run_dir", "error"]
    return markdown_table(view, cols, {"best_val_acc_pct": "val acc %", "best_val_acc5_pct": "val acc@5 %",
                                       "train_images_per_s": "train img/s", "infer_images_per_s": "infer img/s",
                                       "peak_memory_mb": "peak MB", "params_m": "params M", "gmacs": "GMACs",
                                       "run_dir": "run"})


def compare_runs(folder: Path | str, out: Optional[Path | str] = None, x: str = "train") -> dict[str, Any]:
    """Collect a multirun's jobs into ``runs.csv`` / ``runs.md`` (sorted by accuracy; unfinished,
    failed and result-less runs listed as such) and ``accuracy_vs_throughput.png``.

    Args:
        folder: the multirun folder (``multirun/<date>/<time>``) or any folder above job folders.
        out: output folder (default ``<folder>/compare``).
        x: ``"train"`` or ``"infer"``: which throughput goes on the chart's x axis.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder")
    xkey = {"train": "train_images_per_s", "infer": "infer_images_per_s"}[x]
    rows = _sort_runs([read_run(d, folder) for d in find_run_dirs(folder)])
    out = Path(out) if out else folder / "compare"
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, RUN_COLUMNS + ["best_val_acc_pct", "best_val_acc5_pct"], out / "runs.csv")
    table = _runs_md(rows)
    notes = []
    try:
        from vitzoo.attention import list_attention

        ran = {r.get("attention") for r in rows}
        absent = [b for b in list_attention() if b not in ran]
        if absent and rows:
            notes.append(f"Registered backends not in this sweep: {', '.join(absent)}.")
    except Exception:  # noqa: BLE001 - a broken backend module must not stop the comparison
        pass
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    (out / "runs.md").write_text(f"{table}\n\n{len(rows)} runs: {summary}. " + " ".join(notes) + "\n")
    png = plot_bubbles(rows, out / "accuracy_vs_throughput.png", xkey, title=f"{'/'.join(folder.resolve().parts[1:][-3:])}: accuracy vs throughput")
    return {"rows": rows, "table": table, "csv": out / "runs.csv", "md": out / "runs.md", "png": png,
            "summary": summary, "notes": notes}


def sweep_command(experiment: str = "zoo_digits", backends: Optional[Sequence[str]] = None) -> str:
    """The multirun command line with the backend list spelled out (the experiment file's
    ``attention: glob(*)`` already sweeps every ``configs/attention/*.yaml``)."""
    names = list(backends) if backends else select_backends()
    return f"python train.py -m experiment={experiment} attention={','.join(names)}"


if __name__ == "__main__" and "--worker" in sys.argv:
    _worker_main()
