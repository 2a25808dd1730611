"""What a benchmark run depends on: :class:`BenchOptions` and the checks of the names it lists."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from vitzoo.attention import list_attention
from vitzoo.layers.token_reduction import REDUCTIONS
from vitzoo.models import MODELS, model_config
from vitzoo.models.swin import SwinConfig
from vitzoo.models.vit import ViTConfig
from vitzoo.registry import ConfigError, build_config


@dataclass
class BenchOptions:
    """Everything a benchmark run depends on (written to ``environment.json``).

    Args:
        mode: ``"all"``, ``"models"`` or ``"layers"``.
        attention: backends to run (``None``: every registered backend).
        models: model variants (``vitzoo.list_models()``).
        img_sizes: input sides; empty = each model's own ``img_size``.
        model_tokens: models mode: grid token counts (squares) instead of ``img_sizes``: each model runs at the side
            ``sqrt(N) × its patch size`` (64 tokens: vit_cifar at 32 px, swin_cifar at 16 px).
        token_reduction: models mode: ``model.token_reduction`` of every model (``"tome"``, ``"evit"``,
            ``"tokenlearner"`` at their defaults; ``None``: none); rows name the model ``<variant>+<reducer>``
            like the training records, and the timm references are skipped.
        model_options: models mode: fields of every model's config on top of its variant (the fast CIFAR-10
            recipe's ``{"stem": "conv", "stem_full_res_convs": 2, "global_pool": "avg", "pos_embed": "sincos"}``);
            rows keep the variant's name, and the timm references are skipped.
        batches: training/inference batch sizes.
        batch_per_size: models mode: the i-th of ``batches`` runs at the i-th of ``img_sizes`` only (one batch per
            input side, e.g. a smaller batch at the larger side) instead of every side at every batch.
        tokens: token counts of the layer scaling mode (perfect squares: an s×s grid).
        layer_dim, layer_heads, layer_batch, layer_prefix, layer_window: the single layer's
            channels, heads, batch, prefix tokens and natural window side (backends whose window
            option is null use it).
        references: also time the reference implementations (when installed).
        memory_only: models mode: measure each configuration's training peak only (two untimed steps) beside its
            predicted peak (:mod:`vitzoo.bench.memory_rows`): no timing, no FLOPs count, no references.
        pair_global_tokens: up to this token count each layer is timed in alternating blocks (ABBA)
            with ``global`` in the same process, so its speedup over ``global`` is a ratio measured in one
            process; above it (``global`` is quadratic: ~16 s per call at 16,384 tokens on 2 CPU cores)
            the speedup divides times of separate processes. 0: never paired.
        warmup, repeats, min_time, max_time: timing (see :func:`vitzoo.measure.timing.time_fns`);
            ``max_time`` caps the seconds one measurement may take by lowering ``repeats`` (never
            below 3, or below ``repeats`` if that is smaller).
        threads: ``torch.set_num_threads`` in every worker (``None``: torch's default).
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        amp: ``"none"`` or ``"bf16"`` (autocast); with ``memory_only`` also both, ``"none,bf16"``: each configuration
            at each precision, in one run.
        compile: wrap models in ``torch.compile``.
        isolate: one process per configuration (honest peak memory); ``False`` runs in-process.
        jobs: with ``memory_only``, configurations measured side by side, each in its own process (a peak is its
            own process's; timings would disturb each other, so timed runs take 1).
        timeout: seconds before a configuration's process is stopped.
        mem_limit_gb: CPU address-space budget of a worker on top of its start-up size
            (``None``: 80 % of the memory available when the run starts).
        out: output folder (default ``outputs/benchmark/<timestamp>`` under the current folder).
        seed: torch seed in every worker.
    """

    mode: str = "all"
    attention: Optional[list[str]] = None
    models: list[str] = field(default_factory=lambda: ["vit_cifar", "swin_cifar"])
    img_sizes: list[int] = field(default_factory=list)
    model_tokens: list[int] = field(default_factory=list)
    token_reduction: Optional[str] = None
    model_options: dict = field(default_factory=dict)
    batches: list[int] = field(default_factory=lambda: [64])
    batch_per_size: bool = False
    tokens: list[int] = field(default_factory=lambda: [256, 1024, 4096, 16384])
    layer_dim: int = 128
    layer_heads: int = 4
    layer_batch: int = 4
    layer_prefix: int = 0
    layer_window: int = 8
    references: bool = True
    memory_only: bool = False
    pair_global_tokens: int = 4096
    warmup: int = 3
    repeats: int = 5
    min_time: float = 0.5
    max_time: float = 60.0
    threads: Optional[int] = None
    device: str = "auto"
    amp: str = "none"
    compile: bool = False
    isolate: bool = True
    jobs: int = 1
    timeout: float = 900.0
    mem_limit_gb: Optional[float] = None
    out: Optional[str] = None
    seed: int = 0

    def __post_init__(self):
        if self.mode not in ("all", "models", "layers"):
            raise ConfigError(f"--mode must be all, models or layers (got {self.mode!r})")
        amps = self.amp.split(",")
        if not amps or any(a not in ("none", "bf16") for a in amps) or len(set(amps)) != len(amps):
            raise ConfigError(f"--amp must be none, bf16 or, with --memory-only, none,bf16 (got {self.amp!r})")
        if len(amps) > 1 and not self.memory_only:
            raise ConfigError(f"--amp {self.amp}: several precisions in one run need --memory-only")
        if self.jobs < 1 or (self.jobs > 1 and not (self.memory_only and self.isolate)):
            raise ConfigError(f"--jobs {self.jobs}: must be 1, or more with --memory-only and one process per "
                              "configuration (timings of side-by-side processes disturb each other)")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"--device must be auto, cpu or cuda (got {self.device!r})")
        for n in self.model_tokens:
            if math.isqrt(n) ** 2 != n:
                raise ConfigError(f"--model-tokens {n} is not a square: a model's first-stage grid is s x s")
        if self.model_tokens and self.img_sizes:
            raise ConfigError("--model-tokens sets each model's input side: give it or --img-size, not both")
        for n in self.tokens:
            if math.isqrt(n) ** 2 != n:
                raise ConfigError(f"--tokens {n} is not a square: the layer runs on an s x s token grid")
        if self.token_reduction is not None and self.token_reduction not in REDUCTIONS.names():
            raise ConfigError(f"--token-reduction must be one of {', '.join(REDUCTIONS.names())} "
                              f"(got {self.token_reduction!r})")
        for model in self.models if self.model_options else ():  # every option checked before any job starts
            MODELS.config({"name": model, **self.model_options})
        sides = self.model_tokens or self.img_sizes
        if self.batch_per_size and len(self.batches) != len(sides):
            raise ConfigError(f"--batch-per-size needs one --batch per --img-size or --model-tokens (got "
                              f"{len(self.batches)} batches for {len(sides)} sizes)")
        if self.memory_only and self.mode != "models":
            raise ConfigError(f"--memory-only measures model rows: it needs --mode models (got {self.mode!r})")
        if self.repeats < 1:
            raise ConfigError(f"--repeats must be at least 1 (got {self.repeats})")

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "BenchOptions":
        """Strict construction from a mapping (the command line's ``vars(args)``, a config dict).

        Args:
            options: option name -> value; an unknown name is a one-line :class:`ConfigError` naming it.
        """
        return build_config(cls, options, "bench")


def resolve_device(name: str) -> str:
    """``"cpu"`` or ``"cuda"`` for the ``device`` option (``"auto"``: CUDA when available).

    Args:
        name: ``"auto"``, ``"cpu"`` or ``"cuda"``.
    """
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available")
    return name


def select_backends(names: Optional[Iterable[str]] = None) -> list[str]:
    """Registered backends (``vitzoo.list_attention()``), or the named subset (unknown names fail).

    Args:
        names: backends to keep, in this order; ``None`` or empty: all of them.
    """
    known = list_attention()
    if not names:
        return known
    names = list(names)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"--attention: unknown backend(s) {', '.join(unknown)}; registered: {', '.join(known)}")
    return names


def model_family(name: str) -> str:
    """``"vit"`` or ``"swin"``: the family of model variant ``name`` (keys :data:`MODEL_REFERENCES`).

    The benchmark's one question about how variants are declared; it asks the variant's config
    class, so it holds however the variants are registered.

    Args:
        name: a variant from ``vitzoo.list_models()`` (an unknown one is a ConfigError).
    """
    cfg = model_config(name)
    return {ViTConfig: "vit", SwinConfig: "swin"}.get(type(cfg), type(cfg).__name__)


def model_img_size(name: str) -> int:
    """The input side model variant ``name`` is declared with.

    Args:
        name: a variant from ``vitzoo.list_models()``.
    """
    return model_config(name).img_size
