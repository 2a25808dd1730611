"""The sweep comparison behind ``scripts/compare.py``: a Hydra multirun's jobs (their ``results.json``)
as one table sorted by accuracy and an accuracy/throughput bubble chart with its Pareto front."""
from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import matplotlib
import yaml
from matplotlib.figure import Figure  # the object API: no pyplot, no global backend, no open figures

from vitzoo.attention import list_attention
from vitzoo.bench.options import select_backends
from vitzoo.bench.report import markdown_table, save_figure, write_csv
from vitzoo.fileio import atomic_write_text, read_regular_text
from vitzoo.models import list_models

RUN_COLUMNS = [
    "attention",
    "model",
    "data",
    "status",
    "best_val_acc",
    "best_val_acc5",
    "val_loss",
    "train_images_per_s",
    "train_mfu",
    "infer_images_per_s",
    "peak_memory_mb",
    "params",
    "gmacs",
    "gmacs_analytic",
    "epochs",
    "overrides",
    "run_dir",
    "error",
]
X_AXES = {"train": "train_images_per_s", "infer": "infer_images_per_s"}
NAME = re.compile(r"[A-Za-z0-9_.+\-]{1,100}")  # a model, attention or data name in results.json
# results.json fields that must be a finite number (or null) in [low, high]
NUMBERS = {"best_val_acc": (0.0, 1.0), "best_val_acc5": (0.0, 1.0), "val_loss": (-1e30, 1e30),
           "train_images_per_s": (0.0, 1e12), "train_mfu": (0.0, 1e6), "infer_images_per_s": (0.0, 1e12),
           "peak_memory_mb": (0.0, 1e12), "params": (0.0, 1e15), "gmacs": (0.0, 1e15), "gmacs_analytic": (0.0, 1e15),
           "epochs": (0.0, 1e6)}
X_LABELS = {
    "train_images_per_s": "training throughput (images/s)",
    "infer_images_per_s": "inference throughput (images/s)",
}


def find_run_dirs(folder: Path) -> list[Path]:
    """Job folders of a multirun: every folder under ``folder`` holding ``.hydra/`` or ``results.json``,
    in natural order (``2_`` before ``10_``), the ``compare`` output folder excluded.

    Args:
        folder: the multirun folder or any folder above job folders.
    """
    folder = Path(folder)
    found = {p.parent for p in folder.rglob(".hydra") if p.is_dir()}
    found |= {p.parent for p in folder.rglob("results.json")}
    found = {d for d in found if "compare" not in d.relative_to(folder).parts}

    def key(p: Path):
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p.relative_to(folder)))]

    return sorted(found, key=key)


def _read_yaml(path: Path) -> Any:
    """A job's YAML file, None when it is missing, unreadable or not a regular file (a FIFO is never waited on)."""
    try:
        return yaml.safe_load(read_regular_text(path, 1 << 20))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return None


def _read_overrides(run: Path) -> list[str]:
    overrides = _read_yaml(run / ".hydra" / "overrides.yaml")
    return [str(o) for o in overrides] if isinstance(overrides, list) else []


def _choices(run: Path) -> dict[str, str]:
    """Config-group choices of a job: ``hydra.runtime.choices`` in ``.hydra/hydra.yaml``, then overrides."""
    choices: dict[str, str] = {}
    try:
        hy = _read_yaml(run / ".hydra" / "hydra.yaml") or {}
        runtime_choices = hy.get("hydra", {}).get("runtime", {}).get("choices") or {}
        choices.update({str(k): str(v) for k, v in runtime_choices.items()})
    except AttributeError:  # not the mappings Hydra writes
        pass
    for o in _read_overrides(run):
        key, sep, value = o.lstrip("+~").partition("=")
        if sep and "." not in key:
            choices[key] = value
    if not choices.get("model"):  # job folders are named <num>_<model>_<attention> by configs/hydra/default.yaml
        choices["model"] = next((m for m in list_models() if f"_{m}_" in f"_{run.name}_"), None)
    return choices


def bad_results_field(res: Any) -> Optional[str]:
    """The first field of a ``results.json`` that is not what :func:`vitzoo.training.utils.ResultsFile` writes
    (``"(the file)"`` when it is no JSON object), or None when it can be read.

    Args:
        res: the parsed JSON.
    """
    if not isinstance(res, Mapping):
        return "(the file)"
    for k, (low, high) in NUMBERS.items():
        v = res.get(k)
        if v is not None and not (_finite(v) and low <= v <= high):
            return k
    for k in ("attention", "model", "data"):
        v = res.get(k)
        v = v.get("name") if isinstance(v, Mapping) else v
        if v is not None and not (isinstance(v, str) and NAME.fullmatch(v)):
            return k
    for k in ("status", "error"):
        if res.get(k) is not None and not isinstance(res.get(k), str):
            return k
    return None


def _results_fields(res: Mapping[str, Any], choices: Mapping[str, str]) -> dict[str, Any]:
    """The :data:`RUN_COLUMNS` of a ``results.json``, names of dict-valued choices, accuracies in percent."""
    row = {
        k: res[k]
        for k in RUN_COLUMNS
        if k in res and k not in ("overrides", "run_dir") and not (k in ("attention", "model", "data") and not res[k])
    }
    for k in ("attention", "model", "data"):  # results.json may hold dicts ({"name": ...})
        if isinstance(row.get(k), Mapping):
            row[k] = row[k].get("name") or choices.get(k)
    status = str(res.get("status", "unknown"))
    row["status"] = {"running": "unfinished (running)"}.get(status, status)
    for k in ("best_val_acc", "best_val_acc5"):
        row[f"{k}_pct"] = None if row.get(k) is None else 100.0 * float(row[k])
    return row


def read_run(run: Path, root: Optional[Path] = None) -> dict[str, Any]:
    """One job's row: its ``results.json`` (or why it has none) plus its config-group choices.

    Args:
        run: the job folder.
        root: folder ``run_dir`` is given relative to (default: ``run`` as given).
    """
    run = Path(run)
    choices = _choices(run)
    row: dict[str, Any] = {
        "attention": choices.get("attention"),
        "model": choices.get("model"),
        "data": choices.get("data"),
        "overrides": " ".join(o for o in _read_overrides(run) if not o.startswith(("experiment=", "hydra."))),
        "run_dir": str(run.relative_to(root)) if root else str(run),
    }
    path = run / "results.json"
    if not path.exists():
        return {**row, "status": "missing results.json"}
    try:
        res = json.loads(read_regular_text(path, 16 << 20))
    except (OSError, ValueError, RecursionError) as exc:  # a FIFO or device, JSONDecodeError, UnicodeDecodeError
        return {**row, "status": f"unreadable results.json ({type(exc).__name__})"}
    bad = bad_results_field(res)
    if bad:
        return {**row, "status": f"invalid results.json ({bad})"}
    return {**row, **_results_fields(res, choices)}


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated when both coordinates are better larger, sorted by x.

    Args:
        points: ``(x, y)`` pairs, e.g. (throughput, accuracy).
    """
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1]))
    front, best_y = [], -math.inf
    for i in order:
        if points[i][1] > best_y:
            front.append(i)
            best_y = points[i][1]
    return sorted(front, key=lambda i: points[i][0])


def plotted_runs(rows: Sequence[Mapping[str, Any]], x: str) -> list[Mapping[str, Any]]:
    """The runs a chart shows: finished, with a finite accuracy and a finite ``x``.

    Args:
        rows: :func:`read_run` rows.
        x: the throughput key on the x axis.
    """
    return [r for r in rows if r.get("status") == "finished" and _finite(r.get(x)) and _finite(r.get("best_val_acc"))]


def _bubble_keys(ax: Any, cmap: Any, models: list[str], top: Optional[float]) -> None:
    """Legend entries: two bubble sizes (peak memory) and, with several models, one colour each."""
    for mb in [top / 4, top] if top else []:
        ax.scatter(
            [],
            [],
            s=40 + 1500 * mb / top,
            color="grey",
            alpha=0.3,
            edgecolors="black",
            label=f"peak memory {mb:.0f} MB",
        )
    for m in models if len(models) > 1 else []:
        ax.scatter([], [], s=60, color=cmap(models.index(m) % 10), alpha=0.6, label=m)
    ax.legend(
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        labelspacing=3.5,
        borderpad=1.5,
        handletextpad=2.0,
        frameon=False,
    )


def _draw_bubbles(ax: Any, pts: Sequence[Mapping[str, Any]], x: str) -> None:
    models = sorted({str(r.get("model")) for r in pts})
    mems = [float(r["peak_memory_mb"]) for r in pts if _finite(r.get("peak_memory_mb"))]
    top = max(mems) if mems else 1.0
    cmap = matplotlib.colormaps["tab10"]
    for r in pts:
        mem = r.get("peak_memory_mb")
        area = 40 + 1500 * (float(mem) / top if _finite(mem) and top > 0 else 0.1)
        ax.scatter(
            r[x],
            100 * r["best_val_acc"],
            s=area,
            color=cmap(models.index(str(r.get("model"))) % 10),
            alpha=0.45,
            edgecolors="black",
            linewidths=0.6,
        )
        label = r.get("attention") if len(models) == 1 else f"{r.get('attention')} ({r.get('model')})"
        ax.annotate(str(label), (r[x], 100 * r["best_val_acc"]), fontsize=8, ha="center", va="center")
    xy = [(float(r[x]), 100 * float(r["best_val_acc"])) for r in pts]
    front = pareto_front(xy)
    ax.plot(
        [xy[i][0] for i in front],
        [xy[i][1] for i in front],
        "--",
        color="crimson",
        lw=1.5,
        label="Pareto front (faster and more accurate)",
    )
    if max(p[0] for p in xy) / max(min(p[0] for p in xy), 1e-9) > 8:
        ax.set_xscale("log")
    _bubble_keys(ax, cmap, models, top if mems else None)
    ax.margins(0.12)


def plot_bubbles(rows: Sequence[Mapping[str, Any]], path: Path, x: str = "train_images_per_s", title: str = "") -> Path:
    """Accuracy versus throughput: one labelled bubble per run (area ∝ peak memory), Pareto front drawn.

    Runs that are not finished or lack the numbers are listed under the chart instead.

    Args:
        rows: :func:`read_run` rows.
        path: PNG to write.
        x: the throughput key on the x axis.
        title: chart title (default: a description).
    """
    pts = plotted_runs(rows, x)
    left_out = [f"{r.get('attention')} ({r.get('status')})" for r in rows if r not in pts]
    fig = Figure(figsize=(12, 6.5))
    ax = fig.subplots()
    if pts:
        _draw_bubbles(ax, pts, x)
    else:
        ax.text(0.5, 0.5, "no finished run with accuracy and throughput", ha="center", transform=ax.transAxes)
    ax.set_xlabel(X_LABELS.get(x, x))
    ax.set_ylabel("best validation accuracy (%)")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title or "accuracy versus throughput (bubble area: peak memory)")
    if left_out:
        fig.text(0.01, 0.005, "not plotted: " + ", ".join(left_out)[:400], fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return save_figure(fig, path, dpi=120)


def _sort_runs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def key(r):
        acc = r.get("best_val_acc")
        return (r.get("status") != "finished", -(acc if _finite(acc) else -1.0), str(r.get("attention")))

    return sorted(rows, key=key)


def _runs_md(rows: Sequence[Mapping[str, Any]]) -> str:
    view = [{**r, "params_m": r["params"] / 1e6 if _finite(r.get("params")) else None} for r in rows]
    cols = [
        "attention",
        "model",
        "data",
        "status",
        "best_val_acc_pct",
        "best_val_acc5_pct",
        "train_images_per_s",
        "train_mfu",
        "infer_images_per_s",
        "peak_memory_mb",
        "params_m",
        "gmacs",
        "epochs",
        "run_dir",
        "error",
    ]
    return markdown_table(
        view,
        cols,
        {
            "best_val_acc_pct": "val acc %",
            "best_val_acc5_pct": "val acc@5 %",
            "train_images_per_s": "train img/s",
            "train_mfu": "train MFU",
            "infer_images_per_s": "infer img/s",
            "peak_memory_mb": "peak MB",
            "params_m": "params M",
            "gmacs": "GMACs",
            "run_dir": "run",
        },
    )


def _absent_backends(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A note naming the registered backends no job of the sweep ran (none when the sweep is empty)."""
    ran = {r.get("attention") for r in rows}
    absent = [b for b in list_attention() if b not in ran]
    return [f"Registered backends not in this sweep: {', '.join(absent)}."] if absent and rows else []


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
    rows = _sort_runs([read_run(d, folder) for d in find_run_dirs(folder)])
    skipped = [f"{r['run_dir']}/results.json: {r['status']}" for r in rows
               if str(r["status"]).startswith(("invalid", "unreadable"))]
    for line in skipped:
        print(f"not ranked: {line}", file=sys.stderr)
    out = Path(out) if out else folder / "compare"
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, RUN_COLUMNS + ["best_val_acc_pct", "best_val_acc5_pct"], out / "runs.csv")
    table, notes = _runs_md(rows), _absent_backends(rows)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    atomic_write_text(out / "runs.md", f"{table}\n\n{len(rows)} runs: {summary}. " + " ".join(notes) + "\n")
    title = f"{'/'.join(folder.resolve().parts[1:][-3:])}: accuracy vs throughput"
    png = plot_bubbles(rows, out / "accuracy_vs_throughput.png", X_AXES[x], title=title)
    return {
        "rows": rows,
        "table": table,
        "csv": out / "runs.csv",
        "md": out / "runs.md",
        "png": png,
        "summary": summary,
        "notes": notes,
        "skipped": skipped,
    }


def sweep_command(experiment: str = "zoo_digits", backends: Optional[Sequence[str]] = None) -> str:
    """The multirun command line with the backend list spelled out (the experiment file's
    ``attention: glob(*)`` already sweeps every ``configs/attention/*.yaml``).

    Args:
        experiment: ``configs/experiment/<name>.yaml``.
        backends: backends to list (default: every registered one).
    """
    names = list(backends) if backends else select_backends()
    return f"python train.py -m experiment={experiment} attention={','.join(names)}"
