"""The measurements, one configuration each: a model, a layer, and each against its reference.

A job is a plain dict (JSON, so it can be sent to a worker process) with ``kind`` selecting the
function in :data:`JOBS`; each returns one row whose ``status`` is ``"ok"`` or why it is not.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from vitzoo.attention import MixerContext, before_train_step, build_attention, list_attention
from vitzoo.bench.memory_rows import add_prediction, memory_phase
from vitzoo.bench.references import LAYER_REFERENCES, ReferenceUnavailable, layer_reference, timm_reference
from vitzoo.flops import count_flops
from vitzoo.measure.memory import PeakMemory, _malloc_live, is_oom
from vitzoo.measure.timing import Timing, time_fns
from vitzoo.models import create_model
from vitzoo.registry import ConfigError
from vitzoo.training.records import model_label

Row = dict[str, Any]


class _Setup:
    """Per-worker torch set-up: device, threads, seed, autocast, and the memory baseline.

    Args:
        job: the job dict (``device``, ``threads``, ``seed``, ``amp``, ``compile`` and timing options).
    """

    def __init__(self, job: Mapping[str, Any]):
        if job.get("threads"):
            torch.set_num_threads(int(job["threads"]))
        torch.manual_seed(job.get("seed", 0))
        self.device = torch.device(job["device"])
        self.amp = job.get("amp", "none") == "bf16"
        self.compile = bool(job.get("compile", False))
        self.timing = dict(warmup=job.get("warmup", 3), repeats=job.get("repeats", 5),
                           min_time=job.get("min_time", 0.5), max_time=job.get("max_time", 60.0))
        # load every backend module and warm the thread pool so neither counts as the model's memory
        list_attention()
        a = torch.randn(256, 256, device=self.device)
        (a @ a).sum().item()
        del a
        self.memory = PeakMemory(self.device, live=True)
        # every timed phase runs with steady malloc thresholds (a memory phase switches to live and back): under
        # glibc's default dynamic ones and the worker's address-space cap, swin_cifar inference paid ~6,000 page
        # faults per call on one side of a vitzoo/timm pair, after the other side's frees
        _malloc_live(False)

    def autocast(self) -> AbstractContextManager:
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.amp)

    def maybe_compile(self, fn: Callable) -> Callable:
        return torch.compile(fn) if self.compile else fn

    def info(self) -> Row:
        return {"threads": torch.get_num_threads(), "device": str(self.device),
                "amp": "bf16" if self.amp else "none", "compile": self.compile, "memory_method": self.memory.method}


class _ModelSteps:
    """Training step, inference pass and batch-1 pass of one classification model on random data.

    Args:
        setup: the worker's set-up.
        model: the classifier (vitzoo's, or its timm twin).
        batch, img_size: input batch and side.
        cfg: the vitzoo model config giving ``in_chans`` and ``num_classes``.
    """

    def __init__(self, setup: _Setup, model: nn.Module, batch: int, img_size: int, cfg: Any):
        self.setup, self.model = setup, model
        self.net = setup.maybe_compile(model)
        self.x = torch.randn(batch, cfg.in_chans, img_size, img_size, device=setup.device)
        self.y = torch.randint(0, cfg.num_classes, (batch,), device=setup.device)
        self.x1 = self.x[:1].clone()
        self.opt = None

    def train_mode(self) -> None:
        self.model.train()
        if self.opt is None:
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    def eval_mode(self) -> None:
        self.model.eval()

    def train_step(self) -> None:
        before_train_step(self.model)  # as VitModule does before every step (outside the compiled forward)
        self.opt.zero_grad(set_to_none=True)
        with self.setup.autocast():
            loss = nn.functional.cross_entropy(self.net(self.x), self.y)
        loss.backward()
        self.opt.step()

    def infer(self) -> None:
        with torch.inference_mode(), self.setup.autocast():
            self.net(self.x)

    def infer1(self) -> None:
        with torch.inference_mode(), self.setup.autocast():
            self.net(self.x1)


class LayerHost(nn.Module):
    """Calls a token mixer as the blocks do, ``attn(x, grid)``, so it can be compiled like a model."""

    def __init__(self, attn: nn.Module, grid: tuple[int, int]):
        super().__init__()
        self.attn, self.grid = attn, tuple(grid)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, self.grid)


def _error_row(row: Row, exc: BaseException, what: str) -> Row:
    if isinstance(exc, ConfigError):
        row["status"] = f"cannot build: {exc}"
    elif is_oom(exc):
        row["status"] = f"out of memory during {what}"
    else:
        row["status"] = f"error during {what}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return row


def _params(module: nn.Module) -> int:
    return sum(t.numel() for t in module.parameters())


def _timed_phase(row: Row, setup: _Setup, fn: Callable[[], Any], batch: int, key: str) -> Timing:
    """Peak memory of two untimed calls of ``fn``, then its timing; record ``<key>_peak_mb`` and
    ``<key>_img_s`` (median, min, max)."""
    setup.memory.start()
    for _ in range(2):
        fn()
    row[f"{key}_peak_mb"] = setup.memory.peak_mb()
    t = time_fns({"m": fn}, setup.device, **setup.timing)["m"]
    row[f"{key}_img_s"], row[f"{key}_img_s_min"], row[f"{key}_img_s_max"] = t.rate(batch)
    return t


def _infer_phase(row: Row, setup: _Setup, steps: _ModelSteps, batch: int) -> None:
    steps.eval_mode()
    _timed_phase(row, setup, steps.infer, batch, "infer")


def _train_phase(row: Row, setup: _Setup, steps: _ModelSteps, batch: int) -> None:
    steps.train_mode()
    t = _timed_phase(row, setup, steps.train_step, batch, "train")
    row["repeats"], row["iters"] = len(t.seconds), t.iters
    add_prediction(row, steps, setup, batch)  # the predicted peak of these steps (data-dependent sizes as seen)


def _latency_phase(row: Row, setup: _Setup, steps: _ModelSteps, batch: int) -> None:
    steps.eval_mode()
    t = time_fns({"m": steps.infer1}, setup.device, **setup.timing)["m"]
    row["latency_ms"], row["latency_ms_min"], row["latency_ms_max"] = t.median * 1e3, t.min * 1e3, t.max * 1e3


MODEL_PHASES = (("inference", _infer_phase), ("training", _train_phase), ("batch-1 latency", _latency_phase))
MEMORY_PHASES = (("training", memory_phase),)  # memory-only rows: the training peak, untimed


def model_job(job: Mapping[str, Any]) -> Row:
    """One backend × model × image size × batch (run inside a worker process).

    Args:
        job: ``backend``, ``spec`` (attention options), ``model``, ``img_size``, ``batch``, optionally
            ``token_reduction`` (the row's model is then ``<model>+<reducer>``), ``model_options`` (config fields on
            top of the variant), and the common keys.
    """
    setup = _Setup(job)
    reduction = job.get("token_reduction")
    row: Row = {"backend": job["backend"], "model": model_label({"name": job["model"], "token_reduction": reduction}),
                "img_size": job["img_size"], "batch": job["batch"], **setup.info()}
    what = "build"
    try:
        model = create_model(job["model"], attention=job["spec"], img_size=job["img_size"],
                             token_reduction=reduction, **job.get("model_options", {})).to(setup.device)
        row["tokens"] = (job["img_size"] // model.cfg.patch_size) ** 2 + getattr(model, "num_prefix", 0)
        row["params_m"] = _params(model) / 1e6
        steps = _ModelSteps(setup, model, job["batch"], job["img_size"], model.cfg)
        for what, measure in MEMORY_PHASES if job.get("memory_only") else MODEL_PHASES:
            measure(row, setup, steps, job["batch"])
    except Exception as exc:  # noqa: BLE001 - reported in the row
        return _error_row(row, exc, what)
    try:
        if not job.get("memory_only"):  # memory-only rows take seconds: no FLOPs count
            report = count_flops(model, job["img_size"])
            row["gmacs"], row["gmacs_analytic"] = report.measured / 1e9, report.analytic / 1e9
    except Exception as exc:  # noqa: BLE001
        row["note"] = f"fvcore failed: {type(exc).__name__}: {exc}"
    row["status"] = "ok"
    return row


def _time_against_reference(row: Row, phase: str, fa: Callable, fb: Callable, setup: _Setup) -> None:
    """Time ``fa`` (vitzoo) and ``fb`` (reference) in alternating blocks and record, for ``phase``: both
    median times, the speed ratio vitzoo/reference (reference time / vitzoo time) of the medians, and
    the range of the ratios of the paired (back-to-back) blocks: a noise indicator."""
    t = time_fns({"vitzoo": fa, "reference": fb}, setup.device, **setup.timing)
    row[f"{phase}_ms_vitzoo"] = t["vitzoo"].median * 1e3
    row[f"{phase}_ms_reference"] = t["reference"].median * 1e3
    row[f"{phase}_speed_ratio"] = t["reference"].median / t["vitzoo"].median
    row[f"{phase}_speed_ratio_min"], row[f"{phase}_speed_ratio_max"] = _pair_range(t["vitzoo"], t["reference"])
    row["repeats"], row["iters"] = len(t["vitzoo"].seconds), t["vitzoo"].iters


def _pair_range(a: Timing, b: Timing) -> tuple[float, float]:
    """Smallest and largest ratio ``b / a`` of the back-to-back blocks of an alternating timing: a noise indicator."""
    pairs = [tb / ta for ta, tb in zip(a.seconds, b.seconds)]
    return min(pairs), max(pairs)


def model_ref_job(job: Mapping[str, Any]) -> Row:
    """vitzoo model vs its timm twin, timed in alternating blocks (run inside a worker process).

    Args:
        job: as for :func:`model_job`, plus ``reference`` (its description).
    """
    setup = _Setup(job)
    row: Row = {"level": "model", "backend": job["backend"], "reference": job["reference"],
                "case": f"{job['model']} {job['img_size']}px b{job['batch']}", **setup.info()}
    what = "build"
    try:
        vz = create_model(job["model"], attention=job["spec"], img_size=job["img_size"]).to(setup.device)
        ref = timm_reference(vz).to(setup.device)
        row["params_vitzoo"], row["params_reference"] = _params(vz), _params(ref)
        a = _ModelSteps(setup, vz, job["batch"], job["img_size"], vz.cfg)
        b = _ModelSteps(setup, ref, job["batch"], job["img_size"], vz.cfg)
        b.x, b.y, b.x1 = a.x, a.y, a.x1
        for what, fa, fb, mode in (("train", a.train_step, b.train_step, _ModelSteps.train_mode),
                                   ("infer", a.infer, b.infer, _ModelSteps.eval_mode),
                                   ("latency", a.infer1, b.infer1, _ModelSteps.eval_mode)):
            mode(a)
            mode(b)
            _time_against_reference(row, what, fa, fb, setup)
    except ReferenceUnavailable as exc:
        row["status"] = str(exc)
        return row
    except Exception as exc:  # noqa: BLE001
        return _error_row(row, exc, what)
    row["status"] = "ok" if row["params_vitzoo"] == row["params_reference"] else "ok (parameter counts differ)"
    return row


def _layer_context(job: Mapping[str, Any]) -> MixerContext:
    s = math.isqrt(job["tokens"])
    return MixerContext(job["dim"], job["heads"], (s, s), job["prefix"], qkv_bias=True, layer_index=0,
                        window=job["window"])


def _layer_input(job: Mapping[str, Any], ctx: MixerContext, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Random input ``x[B, N, C]`` (requires grad) and output gradient of the same shape."""
    x = torch.randn(job["batch"], ctx.num_prefix + ctx.grid[0] * ctx.grid[1], ctx.dim, device=device,
                    requires_grad=True)
    return x, torch.randn_like(x)


def _fwd_bwd(setup: _Setup, forward: Callable, module: nn.Module, x: torch.Tensor,
             g: torch.Tensor) -> Callable[[], None]:
    def step():
        x.grad = None
        module.zero_grad(set_to_none=True)
        with setup.autocast():
            out = forward(x)
        out.backward(g.to(out.dtype))

    return step


def _fwd(setup: _Setup, forward: Callable, x: torch.Tensor) -> Callable[[], None]:
    x = x.detach()

    def step():
        with torch.inference_mode(), setup.autocast():
            forward(x)

    return step


def _layer_cost(attn: nn.Module, grid: tuple[int, int], gmacs_global: float) -> Row:
    """Analytic cost of ``attn`` on ``grid``, its ratio to ``global``'s, and the parameter count."""
    gmacs = attn.flops(grid) / 1e9
    return {"linear_cost": bool(getattr(attn, "grows_linearly", False)), "formula": getattr(attn, "formula", ""),
            "gmacs_analytic": gmacs, "flops_ratio": gmacs_global / gmacs if gmacs else None,
            "params": _params(attn)}


def _paired_global(job: Mapping[str, Any], ctx: MixerContext, setup: _Setup, x: torch.Tensor,
                   g: torch.Tensor) -> Callable[[], None] | None:
    """fwd+bwd of ``global`` on the same input, to time in alternation with the layer (None: not paired)."""
    if job["backend"] == "global" or job["tokens"] > job.get("pair_global_tokens", 0):
        return None
    ref = build_attention("global", ctx).to(setup.device).train()
    return _fwd_bwd(setup, setup.maybe_compile(LayerHost(ref, ctx.grid)), ref, x, g)


def layer_job(job: Mapping[str, Any]) -> Row:
    """One attention layer at one token count: forward+backward time and peak memory.

    The peak is that of two warm-up steps before anything else is built. Up to ``pair_global_tokens``
    tokens, ``global`` is then built too and both are timed in alternating blocks (ABBA), so
    ``ms_global_paired`` / ``ms`` is a speed ratio measured in one process.

    Args:
        job: ``backend``, ``spec``, ``tokens``, ``dim``, ``heads``, ``batch``, ``prefix``, ``window``,
            ``pair_global_tokens`` and the common keys.
    """
    setup = _Setup(job)
    ctx = _layer_context(job)
    row: Row = {"backend": job["backend"], "tokens": job["tokens"], "grid": f"{ctx.grid[0]}x{ctx.grid[1]}",
                "dim": ctx.dim, "heads": ctx.num_heads, "batch": job["batch"], "prefix": ctx.num_prefix,
                **setup.info()}
    what = "build"
    try:
        row["gmacs_analytic_global"] = build_attention("global", ctx).flops(ctx.grid) / 1e9
        attn = build_attention(job["spec"], ctx).to(setup.device)
        row.update(_layer_cost(attn, ctx.grid, row["gmacs_analytic_global"]))
        what = "forward+backward"
        attn.train()
        setup.memory.start()
        x, g = _layer_input(job, ctx, setup.device)
        step = _fwd_bwd(setup, setup.maybe_compile(LayerHost(attn, ctx.grid)), attn, x, g)
        for _ in range(2):
            step()
        row["peak_mb"] = setup.memory.peak_mb()
        fns = {"m": step}
        what = "global (paired timing)"
        if (paired := _paired_global(job, ctx, setup, x, g)) is not None:
            fns["global"] = paired
        what = "forward+backward"
        t = time_fns(fns, setup.device, **setup.timing)
        row["ms"], row["ms_min"], row["ms_max"] = t["m"].median * 1e3, t["m"].min * 1e3, t["m"].max * 1e3
        row["repeats"], row["iters"] = len(t["m"].seconds), t["m"].iters
        if "global" in t:
            row["ms_global_paired"] = t["global"].median * 1e3
            row["time_ratio_min"], row["time_ratio_max"] = _pair_range(t["m"], t["global"])
    except Exception as exc:  # noqa: BLE001
        return _error_row(row, exc, what)
    row["status"] = "ok"
    return row


def layer_ref_job(job: Mapping[str, Any]) -> Row:
    """vitzoo layer vs the reference package's layer at one token count, alternating blocks.

    Forward and backward when the reference has a backward; forward passes only when it raises
    ``NotImplementedError`` there (e.g. natten's CPU path, flex attention).

    Args:
        job: as for :func:`layer_job`.
    """
    setup = _Setup(job)
    ctx = _layer_context(job)
    row: Row = {"level": "layer", "backend": job["backend"],
                "case": f"{job['tokens']} tokens C={ctx.dim} h={ctx.num_heads} b{job['batch']}",
                "tokens": job["tokens"], "reference": LAYER_REFERENCES.get(job["backend"], ("", ""))[1],
                **setup.info()}
    what = "build"
    try:
        attn = build_attention(job["spec"], ctx).to(setup.device).train()
        ref, kwargs, ref_forward = layer_reference(job["backend"], attn, ctx)
        ref = ref.to(setup.device).train()
        row["reference_kwargs"] = json.dumps(kwargs, default=str)
        row["params_vitzoo"], row["params_reference"] = _params(attn), _params(ref)
        x, g = _layer_input(job, ctx, setup.device)
        what = "forward+backward"
        host = setup.maybe_compile(LayerHost(attn, ctx.grid))
        fa, fb = _fwd_bwd(setup, host, attn, x, g), _fwd_bwd(setup, setup.maybe_compile(ref_forward), ref, x, g)
        phase, status = "fwd_bwd", "ok"
        try:
            fb()
        except NotImplementedError as exc:
            phase, status = "fwd", f"ok (forward only: {str(exc).splitlines()[0][:120]})"
            what = "forward"
            fa, fb = _fwd(setup, LayerHost(attn, ctx.grid), x), _fwd(setup, ref_forward, x)
        _time_against_reference(row, phase, fa, fb, setup)
    except ReferenceUnavailable as exc:
        row["status"] = str(exc)
        return row
    except Exception as exc:  # noqa: BLE001
        return _error_row(row, exc, what)
    row["status"] = status
    return row


JOBS: dict[str, Callable[[Mapping[str, Any]], Row]] = {
    "model": model_job, "model_ref": model_ref_job, "layer": layer_job, "layer_ref": layer_ref_job}
