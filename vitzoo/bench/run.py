"""The benchmark run: every configuration of :class:`BenchOptions` as a job, then the output files."""
from __future__ import annotations

import datetime as _dt
import json
import math
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

from vitzoo.bench.options import BenchOptions, model_family, model_img_size, resolve_device, select_backends
from vitzoo.bench.references import LAYER_REFERENCES, MODEL_REFERENCES, reference_status
from vitzoo.bench.report import SPEED_RATIOS, write_outputs
from vitzoo.bench.worker import run_job
from vitzoo.configs import attention_options
from vitzoo.flops.mfu import matmul_peak, mfu, precision_dtype
from vitzoo.measure.environment import environment, load_average, mem_available_gb
from vitzoo.models import model_config
from vitzoo.training.run_log import open_log

Row = dict[str, Any]
Run = Callable[[dict[str, Any]], Row]  # one job -> its row (streamed to rows.jsonl)


def _log(msg: str) -> None:
    print(msg, flush=True)


def _mem_limit(opts: BenchOptions, device: str) -> Optional[float]:
    """The ``mem_limit_gb`` option, or 80 % of the memory available now (CPU only)."""
    if opts.mem_limit_gb is not None or device != "cpu":
        return opts.mem_limit_gb
    avail = mem_available_gb()
    return round(0.8 * avail, 1) if avail else None


def _common(opts: BenchOptions, device: str, mem_limit_gb: Optional[float]) -> dict[str, Any]:
    """The keys every job shares."""
    return dict(device=device, threads=opts.threads, amp=opts.amp.split(",")[0], compile=opts.compile,
                warmup=opts.warmup, repeats=opts.repeats, min_time=opts.min_time, max_time=opts.max_time,
                seed=opts.seed, mem_limit_gb=mem_limit_gb)


def _runner(opts: BenchOptions, common: Mapping[str, Any], stream: Path) -> Run:
    """Runs a job and appends its row to ``stream`` at once: an interrupted run keeps what it measured."""
    def run(job: dict[str, Any]) -> Row:
        row = run_job({**common, **job}, opts.isolate, opts.timeout)
        for k in ("backend", "model", "img_size", "batch", "tokens"):
            if k in job and k not in row:
                row[k] = job[k]
        with open_log(stream) as f:  # appended as a regular file, never through a symbolic link
            f.write(json.dumps({"kind": job["kind"], **row}, default=str) + "\n")
        return row

    return run


def model_cases(opts: BenchOptions, model: str) -> list[tuple[int, int]]:
    """The (input side, batch) pairs a model runs at: every side (of ``img_sizes``, or ``model_tokens`` grids at the
    model's patch size) at every batch, or with ``batch_per_size`` the i-th side at the i-th batch.

    Args:
        opts: the run's options; model: the model variant (its own side when ``img_sizes`` is empty).
    """
    sides = ([math.isqrt(n) * model_config(model).patch_size for n in opts.model_tokens]  # an s x s grid
             or opts.img_sizes or [model_img_size(model)])
    if opts.batch_per_size:
        return list(zip(sides, opts.batches))
    return [(img, batch) for img in sides for batch in opts.batches]


def _run_models(opts: BenchOptions, backends: list[str], run: Run, log: Callable[[str], None],
                models: list[Row], refs: list[Row]) -> None:
    """Every model × precision × size × batch × backend (``--jobs`` of them side by side), and the timm twin where
    the model has one (none with token reduction or model options: timm's twin has neither)."""
    amps = opts.amp.split(",")
    for model, amp, (img, batch) in [(m, a, case) for m in opts.models for a in amps for case in model_cases(opts, m)]:
        ref_backend, ref_name = MODEL_REFERENCES.get(model_family(model), (None, None))
        jobs = [dict(kind="model", backend=backend, spec=attention_options(backend), model=model, img_size=img,
                     batch=batch, token_reduction=opts.token_reduction, model_options=opts.model_options,
                     memory_only=opts.memory_only, amp=amp) for backend in backends]
        with ThreadPoolExecutor(opts.jobs) as pool:  # --jobs processes side by side (memory-only runs)
            for row in pool.map(run, jobs) if opts.jobs > 1 else map(run, jobs):
                models.append(row)
                log(f"  model {row['model']:11s} {img}px b{batch}{'' if len(amps) == 1 else ' ' + amp} "
                    f"{row['backend']:14s} {_brief_model(row)}")
        if opts.references and not opts.memory_only and ref_backend in backends and opts.token_reduction is None \
                and not opts.model_options:
            row = run(dict(kind="model_ref", backend=ref_backend, spec=attention_options(ref_backend),
                           model=model, img_size=img, batch=batch, reference=ref_name))
            row.setdefault("level", "model")
            row.setdefault("case", f"{model} {img}px b{batch}")
            row.setdefault("reference", ref_name)
            refs.append(row)
            log(f"  ref   {model:11s} {img}px b{batch} vs {ref_name}: {_brief_ref(row)}")


def _run_layer_ref(opts: BenchOptions, backend: str, tokens: int, layer: Mapping[str, Any], run: Run) -> Row:
    ref = run(dict(kind="layer_ref", backend=backend, spec=attention_options(backend), tokens=tokens, **layer))
    ref.setdefault("level", "layer")
    ref.setdefault("case", f"{tokens} tokens C={opts.layer_dim} h={opts.layer_heads} b{opts.layer_batch}")
    ref.setdefault("reference", LAYER_REFERENCES[backend][1])
    return ref


def _run_layers(opts: BenchOptions, backends: list[str], run: Run, log: Callable[[str], None],
                layers: list[Row], refs: list[Row]) -> None:
    """Every backend at every token count (larger counts skipped after running out of memory or time),
    and the layer reference where it is installed."""
    layer = dict(dim=opts.layer_dim, heads=opts.layer_heads, batch=opts.layer_batch, prefix=opts.layer_prefix,
                 window=opts.layer_window, pair_global_tokens=opts.pair_global_tokens)
    for backend in backends:
        stop_reason = None
        for tokens in sorted(opts.tokens):
            if stop_reason:
                row = {"backend": backend, "tokens": tokens, "status": f"skipped: {stop_reason} at fewer tokens"}
            else:
                row = run(dict(kind="layer", backend=backend, spec=attention_options(backend), tokens=tokens,
                               **layer))
                if row["status"].startswith(("out of memory", "timed out", "killed")):
                    stop_reason = row["status"].split(" during")[0]
            layers.append(row)
            log(f"  layer {backend:14s} {tokens:6d} tokens: {_brief_layer(row)}")
            if opts.references and row["status"] == "ok" and reference_status(backend) == "installed":
                refs.append(_run_layer_ref(opts, backend, tokens, layer, run))
                log(f"  ref   {backend:14s} {tokens:6d} tokens vs {refs[-1]['reference']}: {_brief_ref(refs[-1])}")
    add_layer_ratios(layers)


def _unmeasured_layer_refs(opts: BenchOptions, backends: list[str], refs: list[Row]) -> list[Row]:
    """One row per layer reference that produced none: not installed, layer never ran, backend not registered."""
    if not opts.references:
        return []
    seen = {r["backend"] for r in refs if r.get("level") == "layer"}
    rows = [{"level": "layer", "backend": b, "reference": LAYER_REFERENCES[b][1],
             "status": reference_status(b) if reference_status(b) != "installed" else "vitzoo layer did not run"}
            for b in backends if b in LAYER_REFERENCES and b not in seen]
    if opts.attention is None:
        registered = select_backends()
        rows += [{"level": "layer", "backend": name, "reference": LAYER_REFERENCES[name][1],
                  "status": "backend not registered"} for name in LAYER_REFERENCES if name not in registered]
    return rows


def _environment(opts: BenchOptions, device: str, backends: list[str], mem_limit: Optional[float]) -> dict:
    env = environment(device, opts.threads)
    env.update(options=asdict(opts), backends=backends, mem_limit_gb=mem_limit)
    if not opts.isolate:
        env["memory_method"] = "in-process (--no-isolate): " + env["memory_method"].replace(
            " (one process per configuration)", "") + "; earlier configurations' cached memory is not counted"
    return env


def run_benchmark(opts: BenchOptions, log: Callable[[str], None] = _log,
                  command: Optional[str] = None) -> dict[str, Any]:
    """Run the benchmark described by ``opts`` and write its tables, chart and environment.

    Args:
        opts: what to run and how.
        log: receives one progress line per configuration.
        command: the command line that started the run, kept in ``environment.json`` (``command``) for the
            tables generated from it.

    Returns:
        ``{"out": folder, "models": rows, "layers": rows, "references": rows, "environment": env}``.
    """
    device = resolve_device(opts.device)
    backends = select_backends(opts.attention)
    mem_limit = _mem_limit(opts, device)
    out = Path(opts.out or Path("outputs") / "benchmark" / _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S"))
    out.mkdir(parents=True, exist_ok=True)
    env = _environment(opts, device, backends, mem_limit)
    if command:
        env["command"] = command
    # the dense matmul peak for MFU, measured afresh (the benchmark runs on a quiet machine)
    # and cached for training runs
    peak = None if opts.memory_only else matmul_peak(device, precision_dtype(opts.amp), refresh=True)
    env["matmul_peak_gmacs_s"] = peak / 1e9 if peak else None
    log(
        f"vitzoo benchmark -> {out}\n  device {device} ({env.get('gpu', env['cpu_model'])}), threads "
        f"{env['torch_threads']}, load {env['load_average']}, backends: {', '.join(backends)}"
    )
    t_start = time.time()
    run = _runner(opts, _common(opts, device, mem_limit), out / "rows.jsonl")
    models: list[Row] = []
    layers: list[Row] = []
    refs: list[Row] = []
    if opts.mode in ("all", "models"):
        _run_models(opts, backends, run, log, models, refs)
    if opts.mode in ("all", "layers"):
        _run_layers(opts, backends, run, log, layers, refs)
        refs += _unmeasured_layer_refs(opts, backends, refs)
    add_mfu(models, layers, peak)
    env.update(load_average_end=load_average(), wall_seconds=round(time.time() - t_start, 1))
    result = {"out": str(out), "models": models, "layers": layers, "references": refs, "environment": env}
    write_outputs(result, out)
    log(f"\nwritten: {', '.join(sorted(p.name for p in out.iterdir()))} in {out}")
    return result


def _brief_model(row: Mapping[str, Any]) -> str:
    if row.get("status") != "ok":
        return row.get("status", "?")
    if row.get("train_img_s") is None:  # a memory-only row
        return f"peak {row['train_peak_mb']:.0f} MB, predicted {row.get('predicted_peak_mb') or 0:.0f} MB"
    return (
        f"train {row['train_img_s']:.1f} img/s, infer {row['infer_img_s']:.1f} img/s, "
        f"b1 {row['latency_ms']:.2f} ms, peak {row['train_peak_mb']:.0f} MB"
    )


def _brief_layer(row: Mapping[str, Any]) -> str:
    if row.get("status") != "ok":
        return row.get("status", "?")
    return f"{row['ms']:.2f} ms fwd+bwd, peak {row['peak_mb']:.0f} MB"


def _brief_ref(row: Mapping[str, Any]) -> str:
    if not str(row.get("status", "")).startswith("ok"):
        return row.get("status", "?")
    parts = [f"{k[: -len('_speed_ratio')].replace('_', '+')} x{row[k]:.2f}" for k in SPEED_RATIOS if k in row]
    return "vitzoo/reference speed " + ", ".join(parts)


def add_layer_ratios(layers: list[Row]) -> None:
    """Measured speedup over ``global`` (``time_ratio``) and its share of the analytic one (``efficiency``).

    The speedup is ``ms_global_paired / ms`` where the layer was timed in alternation with ``global``
    in its process (``ratio_method`` ``paired``), else ``global``'s row time over the layer's
    (``separate processes``).

    Args:
        layers: layer rows, updated in place.
    """
    global_ms = {r["tokens"]: r["ms"] for r in layers if r.get("backend") == "global" and r.get("status") == "ok"}
    for r in layers:
        if r.get("status") != "ok":
            continue
        if r.get("ms_global_paired"):
            r["time_ratio"], r["ratio_method"] = r["ms_global_paired"] / r["ms"], "paired"
        elif r["tokens"] in global_ms:
            r["time_ratio"] = global_ms[r["tokens"]] / r["ms"]
            r["ratio_method"] = "same row" if r.get("backend") == "global" else "separate processes"
        if r.get("time_ratio") and r.get("flops_ratio"):
            r["efficiency"] = r["time_ratio"] / r["flops_ratio"]


def add_mfu(models: list[Row], layers: list[Row], peak: Optional[float]) -> None:
    """Achieved GMACs/s and MFU (see :mod:`vitzoo.flops.mfu`) of every timed row, in place.

    A layer row's work is its analytic MACs × batch × 3 (forward + backward); a model row's training
    work is analytic MACs × 3 per image at ``train_img_s``, its inference work MACs per image at ``infer_img_s``.

    Args:
        models, layers: rows of the run.
        peak: the machine's dense matmul peak in MACs/s for the run's dtype.
    """
    for r in layers:
        if r.get("status") == "ok" and r.get("gmacs_analytic"):
            secs = r["ms"] / 1e3
            r["gmacs_s"] = r["gmacs_analytic"] * r["batch"] * 3 / secs
            r["mfu"] = mfu(r["gmacs_analytic"] * 1e9 * r["batch"] * 3, secs, peak)
    for r in models:
        if r.get("status") == "ok" and r.get("gmacs_analytic"):
            for phase, factor in (("train", 3), ("infer", 1)):
                if r.get(f"{phase}_img_s"):
                    r[f"{phase}_gmacs_s"] = r["gmacs_analytic"] * factor * r[f"{phase}_img_s"]
                    r[f"{phase}_mfu"] = mfu(r[f"{phase}_gmacs_s"] * 1e9, 1.0, peak)
