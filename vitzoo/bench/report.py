"""The benchmark's outputs: CSV and Markdown tables, the layer scaling chart, ``report.md``."""
from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import matplotlib
from matplotlib.figure import Figure  # the object API: no pyplot, no global backend, no open figures
from matplotlib.ticker import NullFormatter, ScalarFormatter

from vitzoo.bench.memory_rows import PREDICTION_COLUMNS
from vitzoo.fileio import atomic_write_bytes, atomic_write_text

MODEL_COLUMNS = [
    "backend",
    "model",
    "img_size",
    "batch",
    "tokens",
    "status",
    "train_img_s",
    "train_img_s_min",
    "train_img_s_max",
    "train_mfu",
    "train_gmacs_s",
    "infer_img_s",
    "infer_img_s_min",
    "infer_img_s_max",
    "infer_mfu",
    "infer_gmacs_s",
    "latency_ms",
    "latency_ms_min",
    "latency_ms_max",
    "train_peak_mb",
    *PREDICTION_COLUMNS,  # the predicted training peak, term by term (vitzoo.bench.memory_rows)
    "infer_peak_mb",
    "params_m",
    "gmacs",
    "gmacs_analytic",
    "repeats",
    "iters",
    "threads",
    "device",
    "amp",
    "compile",
    "memory_method",
    "note",
]
LAYER_COLUMNS = [
    "backend",
    "tokens",
    "grid",
    "status",
    "ms",
    "ms_min",
    "ms_max",
    "peak_mb",
    "gmacs_analytic",
    "gmacs_analytic_global",
    "flops_ratio",
    "time_ratio",
    "time_ratio_min",
    "time_ratio_max",
    "efficiency",
    "ratio_method",
    "ms_global_paired",
    "gmacs_s",
    "mfu",
    "linear_cost",
    "formula",
    "params",
    "dim",
    "heads",
    "batch",
    "prefix",
    "repeats",
    "iters",
    "threads",
    "device",
    "amp",
    "compile",
    "memory_method",
]
SPEED_RATIOS = (
    "train_speed_ratio",
    "infer_speed_ratio",
    "latency_speed_ratio",
    "fwd_bwd_speed_ratio",
    "fwd_speed_ratio",
)
REF_COLUMNS = [
    "level",
    "backend",
    "case",
    "reference",
    "status",
    *SPEED_RATIOS,
    "train_ms_vitzoo",
    "train_ms_reference",
    "infer_ms_vitzoo",
    "infer_ms_reference",
    "latency_ms_vitzoo",
    "latency_ms_reference",
    "fwd_bwd_ms_vitzoo",
    "fwd_bwd_ms_reference",
    "fwd_ms_vitzoo",
    "fwd_ms_reference",
    "params_vitzoo",
    "params_reference",
    "reference_kwargs",
    "repeats",
    "iters",
    "threads",
    "device",
]

Rows = Sequence[Mapping[str, Any]]


# --------------------------------------------------------------------------------------------- tables


def fmt(v: Any) -> str:
    """A table cell: blank for missing/NaN, yes/no for booleans, about three significant digits for floats."""
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


def markdown_table(rows: Rows, columns: Sequence[str], headers: Optional[Mapping[str, str]] = None) -> str:
    """A GitHub Markdown table of ``rows`` restricted to ``columns`` (``|`` in cells escaped).

    Args:
        rows: one mapping per row.
        columns: keys to show, in order.
        headers: column key -> header text (default: the key).
    """
    headers = headers or {}
    head = [headers.get(c, c) for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c)).replace("|", "\\|").replace("\n", " ") for c in columns) + " |")
    return "\n".join(lines)


def write_csv(rows: Rows, columns: Sequence[str], path: Path) -> None:
    """CSV with ``columns`` first and any other keys found in ``rows`` after them.

    Args:
        rows: one mapping per row.
        columns: the leading columns, in order.
        path: file to write.
    """
    extra = sorted({k for r in rows for k in r} - set(columns))
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=list(columns) + extra, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    atomic_write_text(path, buf.getvalue())  # atomic, never through a symlink


def save_figure(fig: Figure, path: Path, **savefig: Any) -> Path:
    """Render ``fig`` as PNG and write it to ``path`` atomically (never through a symlink).

    Args:
        fig: the figure.
        path: the PNG file.
        **savefig: options of ``Figure.savefig`` (``dpi``, ``bbox_inches``).
    """
    buf = io.BytesIO()
    fig.savefig(buf, format="png", **savefig)
    return atomic_write_bytes(path, buf.getvalue())


def _range(r: Mapping[str, Any], key: str) -> str:
    v = r.get(key)
    if v is None:
        return ""
    lo, hi = r.get(f"{key}_min"), r.get(f"{key}_max")
    return f"{fmt(v)} ({fmt(lo)}–{fmt(hi)})" if lo is not None and hi is not None else fmt(v)


def _model_md(rows: Rows) -> str:
    view = [
        {**r, "train": _range(r, "train_img_s"), "infer": _range(r, "infer_img_s"), "latency": _range(r, "latency_ms")}
        for r in rows
    ]
    cols = [
        "backend",
        "model",
        "img_size",
        "batch",
        "status",
        "train",
        "train_mfu",
        "infer",
        "infer_mfu",
        "latency",
        "train_peak_mb",
        "predicted_peak_mb",
        "infer_peak_mb",
        "params_m",
        "gmacs",
        "gmacs_analytic",
    ]
    return markdown_table(
        view,
        cols,
        {
            "img_size": "img",
            "train": "train img/s (min–max)",
            "infer": "infer img/s (min–max)",
            "latency": "batch-1 ms (min–max)",
            "train_peak_mb": "train peak MB",
            "predicted_peak_mb": "predicted MB",
            "train_mfu": "train MFU",
            "infer_mfu": "infer MFU",
            "infer_peak_mb": "infer peak MB",
            "params_m": "params M",
            "gmacs": "GMACs (fvcore)",
            "gmacs_analytic": "GMACs (analytic)",
        },
    )


def _layer_md(rows: Rows) -> str:
    view = [{**r, "time": _range(r, "ms"), "time_ratio": _range(r, "time_ratio")} for r in rows]
    cols = [
        "backend",
        "tokens",
        "status",
        "time",
        "peak_mb",
        "gmacs_analytic",
        "flops_ratio",
        "time_ratio",
        "efficiency",
        "ratio_method",
        "mfu",
        "formula",
    ]
    return markdown_table(
        view,
        cols,
        {
            "time": "fwd+bwd ms (min–max)",
            "peak_mb": "peak MB",
            "gmacs_analytic": "GMACs/img (analytic)",
            "flops_ratio": "FLOPs ratio global/backend",
            "time_ratio": "time ratio global/backend (paired min–max)",
            "efficiency": "time ratio / FLOPs ratio",
            "ratio_method": "time ratio from",
            "mfu": "MFU",
        },
    )


def _ref_md(rows: Rows) -> str:
    rows = [{**r, **{k: _range(r, k) for k in SPEED_RATIOS}} for r in rows]
    cols = ["level", "backend", "case", "reference", "status", *SPEED_RATIOS, "params_vitzoo", "params_reference"]
    return markdown_table(
        rows,
        cols,
        {
            "train_speed_ratio": "train × (paired min–max)",
            "infer_speed_ratio": "infer ×",
            "latency_speed_ratio": "batch-1 ×",
            "fwd_bwd_speed_ratio": "fwd+bwd ×",
            "fwd_speed_ratio": "fwd only ×",
            "params_vitzoo": "params vitzoo",
            "params_reference": "params reference",
        },
    )


# --------------------------------------------------------------------------------------------- chart


def _scaling_axes(axes: Sequence[Any], ticks: Sequence[int]) -> None:
    for ax, ylabel in zip(axes, ("forward+backward time (ms)", "peak memory over baseline (MB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(ticks)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("tokens N")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)


def plot_scaling(layers: Rows, path: Path, title: str = "") -> Optional[Path]:
    """Log-log time (and peak memory) versus tokens, one line per backend. ``None`` if nothing ran.

    Args:
        layers: layer rows (those with status ``ok`` are drawn, the others listed under the chart).
        path: PNG to write.
        title: chart title (default: a description).
    """
    ok = [r for r in layers if r.get("status") == "ok"]
    if not ok:
        return None
    fig = Figure(figsize=(14, 5.5))
    ax_t, ax_m = fig.subplots(1, 2)
    backends = sorted({r["backend"] for r in ok}, key=lambda b: (b != "global", b))
    cmap, markers = matplotlib.colormaps["tab20"], "os^vD<>ph*Xd"
    for i, b in enumerate(backends):
        pts = sorted((r["tokens"], r["ms"], r.get("peak_mb")) for r in ok if r["backend"] == b)
        style = (
            dict(color="black", lw=2.5, marker="o")
            if b == "global"
            else dict(color=cmap(i % 20), lw=1.3, marker=markers[i % len(markers)], ls="-" if i < 10 else "--")
        )
        ax_t.plot([p[0] for p in pts], [p[1] for p in pts], ms=4, label=b, **style)
        mem = [(p[0], p[2]) for p in pts if p[2]]
        if mem:
            ax_m.plot([p[0] for p in mem], [p[1] for p in mem], ms=4, label=b, **style)
    _scaling_axes((ax_t, ax_m), sorted({r["tokens"] for r in layers}))
    if ax_m.lines:  # no line when no phase used memory over the baseline
        ax_m.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    failed = sorted({f"{r['backend']}@{r['tokens']}" for r in layers if r.get("status") != "ok"})
    if failed:
        fig.text(0.01, 0.01, "not run: " + ", ".join(failed)[:300], fontsize=7)
    fig.suptitle(title or "one attention layer: time and memory versus tokens")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return save_figure(fig, path, dpi=120)


# --------------------------------------------------------------------------------------------- files


def _report_head(env: Mapping[str, Any]) -> str:
    return (
        f"# vitzoo benchmark {env['date']}\n\n"
        f"device **{env['device']}** ({env.get('gpu') or env['cpu_model']}), torch {env['torch']}, "
        f"{env['torch_threads']} threads, load average {env['load_average']} → {env.get('load_average_end')}, "
        f"amp {env['options']['amp']}, compile {env['options']['compile']}, dense matmul peak "
        f"{env.get('matmul_peak_gmacs_s')} GMACs/s (MFU = analytic MACs × 3 for fwd+bwd ÷ time ÷ peak). "
        "Numbers are medians over "
        f"repeats (min–max in brackets), warm-up excluded. Peak memory: {env['memory_method']}.\n"
    )


TABLES = (
    ("models", MODEL_COLUMNS, _model_md),
    ("layers", LAYER_COLUMNS, _layer_md),
    ("references", REF_COLUMNS, _ref_md),
)


def write_outputs(result: Mapping[str, Any], out: Path) -> None:
    """``environment.json``, ``results.json``, ``{models,layers,references}.{csv,md}``,
    ``layer_scaling.png`` and ``report.md`` (all tables in one page) under ``out``.

    Args:
        result: what :func:`vitzoo.bench.run.run_benchmark` returns.
        out: the output folder (exists).
    """
    env = result["environment"]
    atomic_write_text(out / "environment.json", json.dumps(env, indent=2, default=str))
    atomic_write_text(out / "results.json", json.dumps({k: v for k, v in result.items() if k != "out"}, indent=2,
                                                       default=str))
    sections = [_report_head(env)]
    for name, columns, md in TABLES:
        rows = result[name]
        if not rows:
            continue
        write_csv(rows, columns, out / f"{name}.csv")
        table = md(rows) if md else markdown_table(rows, columns)
        atomic_write_text(out / f"{name}.md", table + "\n")
        sections.append(f"## {name}\n\n{table}\n")
    if result["layers"] and plot_scaling(result["layers"], out / "layer_scaling.png"):
        sections.append("![layer scaling](layer_scaling.png)\n")
    atomic_write_text(out / "report.md", "\n".join(sections))
