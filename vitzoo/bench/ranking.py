"""Accuracy from committed result records joined with speed from the quiet benchmark: the CIFAR-10 ranking.

The sweep (``experiment=zoo_cifar10``) leaves one record per finished job (:mod:`vitzoo.training.records`):
accuracy, its 95 % interval over the validation images, budget, precision, commit and CPU. Training/inference
images/s and the per-process training peak memory come from ``scripts/benchmark.py --mode models`` run on a
quiet machine (its ``models.csv``), joined by (model, attention, image size). Each column of the table says
where it came from.
"""
from __future__ import annotations

import csv
import io
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import fmean
from typing import Any, Optional

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from vitzoo.attention import FAMILY_PACKAGES, attention_family
from vitzoo.bench.compare import pareto_front
from vitzoo.bench.docs_block import block_markers, read_docs, replace_block
from vitzoo.bench.labels import place_labels
from vitzoo.bench.report import markdown_table, save_figure, write_csv
from vitzoo.fileio import atomic_write_text, read_regular_text
from vitzoo.registry import ConfigError
from vitzoo.training.records import read_records, wilson_interval

# the generated block in a Markdown file: "<" and ">" never occur in a record's fields, so no row can hold a marker
BEGIN, END = "<!-- cifar10-ranking:begin -->", "<!-- cifar10-ranking:end -->"  # the default block (--block)


MAX_LABELS = 40  # the most accurate points of a chart get a label; the others are drawn unlabelled
MAX_CHARTS = 12  # charts for the first budgets (epochs) only; every budget gets its table
COLUMNS = ["attention", "family", "model", "epochs", "top1", "top1_ci95", "seeds", "top5", "train_img_s", "infer_img_s",
           "train_peak_mb", "precision", "commit"]
HEADERS = {"top1": "top-1 % (record)", "top1_ci95": "95 % interval (record)", "seeds": "per seed % (interval)",
           "top5": "top-5 %", "train_img_s": "train img/s (benchmark)", "infer_img_s": "infer img/s (benchmark)",
           "train_peak_mb": "train peak MB (benchmark)"}
FAMILY_COLORS = dict(zip(FAMILY_PACKAGES, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple",
                                           "tab:brown")))  # one colour per attention family in the chart


def _num(v: Any) -> Optional[float]:
    """A benchmark cell as a finite number in [0, 1e12), else None (left empty, never guessed)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) and 0 <= f < 1e12 else None


def read_benchmark(path: Any) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Rows of a benchmark ``models.csv`` keyed by (model, attention, image size); finished rows only.

    Args:
        path: the ``models.csv`` written by ``scripts/benchmark.py --mode models``.
    """
    rows: dict[tuple[str, str, int], dict[str, Any]] = {}
    try:
        text = read_regular_text(path)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--benchmark {path}: not readable ({getattr(e, 'strerror', None) or type(e).__name__})"
                          ) from None
    for r in csv.DictReader(io.StringIO(text, newline="")):
        if r.get("status") not in (None, "", "ok"):
            continue
        try:
            key = (str(r["model"]), str(r["backend"]), int(float(r["img_size"])))
        except (KeyError, TypeError, ValueError, OverflowError):
            continue
        rows[key] = {"train_img_s": _num(r.get("train_img_s")), "infer_img_s": _num(r.get("infer_img_s")),
                     "train_peak_mb": _num(r.get("train_peak_mb")), "bench_batch": r.get("batch"),
                     "bench_amp": r.get("amp")}
    return rows


def family_of(attention: str) -> str:
    """The family (subpackage) of a registered backend (records name registered backends only)."""
    return attention_family(attention)


def _interval(accuracy: float, record: Mapping[str, Any]) -> tuple[Optional[float], Optional[float]]:
    """95 % interval over ``record``'s validation images of ``accuracy`` (a mean over seeds: same images)."""
    n = record.get("val_images")
    return wilson_interval(accuracy, int(n)) if n else (None, None)


def _seed_cell(record: Mapping[str, Any]) -> str:
    """``"56.4 (55.0–57.7)"``: one seed's top-1 % and its interval over the validation images."""
    low, high = record.get("top1_ci95") or (None, None)
    acc = f"{100 * float(record['top1']):.1f}"
    return f"{acc} ({100 * low:.1f}–{100 * high:.1f})" if low is not None else acc


def aggregate(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (model, attention, epochs): the mean top-1 and top-5 over seeds, the top-1 interval over the
    validation images, (where several seeds exist) each seed's top-1 with its own interval, and every commit.

    Args:
        records: :func:`vitzoo.training.records.read_records` output.
    """
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["model"], r["attention"], r.get("epochs")), []).append(r)
    families = {name: family_of(name) for name in {a for _, a, _ in groups}}  # one registry look-up per backend
    rows = []
    for (model, attention, epochs), recs in groups.items():
        recs = sorted(recs, key=lambda r: r.get("seed") or 0)
        accs = [100 * float(r["top1"]) for r in recs]
        top5 = [100 * float(r["top5"]) for r in recs if r.get("top5") is not None]
        first = recs[0]
        mean = fmean(accs)
        low, high = _interval(mean / 100, first) if len(recs) > 1 else (first.get("top1_ci95") or (None, None))
        rows.append({
            "model": model, "attention": attention, "family": families[attention], "epochs": epochs,
            "img_size": first.get("img_size"), "experiment": first.get("experiment"),
            "top1": mean,
            "top1_ci95": f"{100 * low:.1f}–{100 * high:.1f}" if low is not None else None,
            "ci_low": 100 * low if low is not None else None, "ci_high": 100 * high if high is not None else None,
            "seeds": " / ".join(_seed_cell(r) for r in recs) if len(recs) > 1 else None,
            "seed_top1": accs,
            "top5": fmean(top5) if top5 else None,
            "precision": first.get("precision"), "cpu": first.get("cpu"),
            "commit": ", ".join(dict.fromkeys(str(r["commit"]) for r in recs if r.get("commit"))) or None,
            "val_images": first.get("val_images"), "images_seen": first.get("images_seen"),
            "wall_s": sum(float(r.get("wall_s") or 0) for r in recs)})
    return sorted(rows, key=lambda r: (r["epochs"] or 0, -r["top1"], r["attention"]))


def benchmark_files(path: Path) -> list[Path]:
    """``path`` itself when it is a file, else every ``models.csv`` under it (sorted; a later file's row wins)."""
    if path.is_file():
        return [path]
    return sorted(path.rglob("models.csv")) if path.is_dir() else []


def join_benchmark(rows: list[dict[str, Any]], bench: Mapping[tuple[str, str, int], Mapping[str, Any]]) -> None:
    """Add the benchmark's images/s and peak memory to each row (None where it has no matching row)."""
    for r in rows:
        found = bench.get((r["model"], r["attention"], int(r.get("img_size") or 0)), {})
        for k in ("train_img_s", "infer_img_s", "train_peak_mb"):
            r[k] = found.get(k)


def plot_ranking(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """Write :func:`ranking_figure` to ``path`` (PNG), the legends right of the axes included.

    Args:
        rows: :func:`aggregate` rows of one budget, joined with the benchmark.
        path: PNG to write.
        title: chart title (name the CPU and the budget).
    """
    return save_figure(ranking_figure(rows, title), path, dpi=120, bbox_inches="tight")


def ranking_figure(rows: Sequence[Mapping[str, Any]], title: str) -> Figure:
    """Top-1 against training images/s with 95 % intervals, bubble area = training peak memory, Pareto front.

    Args:
        rows: :func:`aggregate` rows of one budget, joined with the benchmark.
        title: chart title (name the CPU and the budget).
    """
    pts = [r for r in rows if r.get("train_img_s")]
    fig = Figure(figsize=(11, 6.5))
    ax = fig.subplots()
    ax.set_xlabel("training images/s (scripts/benchmark.py, quiet machine)")
    ax.set_ylabel("top-1 validation accuracy (%), 95 % interval")
    ax.grid(True, alpha=0.3)
    ax.set_title(title, fontsize=10)
    if not pts:
        ax.text(0.5, 0.5, "no benchmark rows to place the records on (run scripts/benchmark.py --mode models)",
                ha="center", transform=ax.transAxes)
    top = max((r.get("train_peak_mb") or 0) for r in pts) if pts else 1.0

    def area(mb: float) -> float:  # marker area grows with the training peak memory
        return 40 + 1200 * (mb / top if top else 0.1)

    if pts:  # one artist per kind of mark, whatever the number of rows: drawing time grows linearly
        xs, ys = [float(r["train_img_s"]) for r in pts], [float(r["top1"]) for r in pts]
        ax.scatter(xs, ys, s=[area(r.get("train_peak_mb") or 0) for r in pts], alpha=0.45, edgecolors="black",
                   linewidths=0.6, color=[FAMILY_COLORS.get(r.get("family"), "grey") for r in pts])
        ci = [(x, y, r) for x, y, r in zip(xs, ys, pts) if r.get("ci_low") is not None]
        if ci:
            ax.errorbar([x for x, _, _ in ci], [y for _, y, _ in ci], fmt="none", ecolor="grey", lw=1,
                        yerr=[[y - r["ci_low"] for _, y, r in ci], [r["ci_high"] - y for _, y, r in ci]])
        seeds = [(x, s) for x, r in zip(xs, pts) if len(r.get("seed_top1") or []) > 1 for s in r["seed_top1"]]
        if seeds:  # each seed's top-1: the seed spread next to the interval
            ax.scatter([x for x, _ in seeds], [s for _, s in seeds], marker="_", s=120, color="black", lw=1.2)
    if pts:
        xy = [(float(r["train_img_s"]), float(r["top1"])) for r in pts]
        front = pareto_front(xy)
        ax.plot([xy[i][0] for i in front], [xy[i][1] for i in front], "--", color="crimson", lw=1.5, marker="D",
                ms=6, mfc="none",  # the marker shows a front of one point too
                label="Pareto front (faster and more accurate)")
        for mb in _legend_sizes([r.get("train_peak_mb") or 0 for r in pts]):
            ax.scatter([], [], s=area(mb), alpha=0.4, edgecolors="black", linewidths=0.6, color="grey",
                       label=f"training peak {mb:.0f} MB")
        # both legends right of the axes, where no bubble, interval or label can fall under them
        sizes = ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(1.01, 0.0), labelspacing=1.5, borderpad=1.0)
        families = [f for f in FAMILY_PACKAGES if any(r.get("family") == f for r in pts)]
        ax.legend(handles=[Line2D([], [], ls="", marker="o", ms=8, alpha=0.45, mec="black",
                                  color=FAMILY_COLORS.get(f, "grey"), label=f.replace("_", " ")) for f in families],
                  fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="family", title_fontsize=8)
        ax.add_artist(sizes).set_clip_on(False)  # add_artist clips to the axes; this legend lies outside them
    _annotate(fig, ax, pts)
    return fig


LABEL_PT = 8  # font size of the bubble labels (points)


def _annotate(fig: Figure, ax: Any, pts: Sequence[Mapping[str, Any]]) -> None:
    """Label the :data:`MAX_LABELS` most accurate bubbles with their backend, most accurate first, without labels
    overlapping where a spot is free."""
    fig.tight_layout()
    ax.autoscale_view()
    ax.set_xlim(ax.get_xlim())  # freeze the limits: the placement is computed in these coordinates
    ax.set_ylim(ax.get_ylim())
    to_pt = 72.0 / fig.dpi
    order = sorted(pts, key=lambda r: -float(r["top1"]))[:MAX_LABELS]
    names = [r["attention"] + ("" if r["model"] == "vit_cifar" else f" ({r['model']})") for r in order]
    anchors = [tuple(v * to_pt for v in ax.transData.transform((float(r["train_img_s"]), float(r["top1"]))))
               for r in order]
    x0, y0, x1, y1 = (v * to_pt for v in ax.get_window_extent().extents)
    offsets = place_labels(anchors, [0.62 * LABEL_PT * len(n) for n in names], 1.35 * LABEL_PT, (x0, y0, x1, y1))
    for r, name, (dx, dy) in zip(order, names, offsets):
        ax.annotate(name, (float(r["train_img_s"]), float(r["top1"])), fontsize=LABEL_PT, ha="left", va="bottom",
                    xytext=(dx, dy), textcoords="offset points")


def _legend_sizes(peaks: Sequence[float]) -> list[float]:
    """Two round memory sizes spanning ``peaks`` (MB) for the bubble legend (one where all are alike)."""
    lo, hi = min(peaks), max(peaks)
    step = 100 if hi >= 200 else 10
    sizes = sorted({max(step, round(lo / step) * step), max(step, round(hi / step) * step)})
    return sizes if hi > 0 else []


def _budget_name(epochs: Any) -> str:
    return f"{epochs} epochs" if epochs is not None else "unknown budget"


def _fmt(rows: Sequence[Mapping[str, Any]]) -> str:
    return markdown_table(list(rows), COLUMNS, HEADERS)


def top_backends(folder: Any, k: int, exclude: Sequence[str] = (), epochs: Optional[int] = None,
                 skipped: Optional[list[str]] = None) -> list[str]:
    """The ``k`` most accurate backends of ``vit_cifar`` in the records under ``folder`` (for follow-up runs).

    Args:
        folder: record folder.
        k: how many names.
        exclude: backends left out (e.g. ``global``, ``window``, which the plan runs anyway).
        epochs: only records of this budget (None: any).
        skipped: collects one line per bad record left out (see :func:`vitzoo.training.records.read_records`).
    """
    rows = [r for r in aggregate(read_records(folder, skipped)) if r["model"] == "vit_cifar"
            and r["attention"] not in exclude and (epochs is None or r["epochs"] == epochs)]
    return [r["attention"] for r in sorted(rows, key=lambda r: -r["top1"])[:k]]


def chart_name(epochs: int) -> str:
    """The chart file of one budget: a fixed template around the validated integer ``epochs``."""
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 0:
        raise ConfigError(f"epochs={epochs!r} cannot name a chart")
    return f"accuracy_vs_throughput_{epochs}ep.png"


def rank_records(folder: Any, benchmark: Optional[Any] = None, out: Optional[Any] = None,
                 docs: Optional[Any] = None, block: str = "cifar10-ranking") -> dict[str, Any]:
    """Tables (Markdown + CSV) and one chart per budget from the records under ``folder``.

    Every file is written atomically under ``out`` with a fixed name (a symbolic link there is replaced, its target
    left alone); a bad record is left out with one line (``skipped`` in the result, also printed on stderr).

    Args:
        folder: record folder (e.g. ``results/cifar10``).
        benchmark: the quiet benchmark's ``models.csv``, or a folder holding one or more (one per benchmark run,
            e.g. ``vit_cifar/models.csv``); default ``<folder>/benchmark``.
        out: where the tables and charts go (default ``folder``).
        docs: a Markdown file whose generated block receives the tables and chart links.
        block: the name of that block (one folder per recipe, one block per folder).
    """
    folder = Path(folder)
    block_markers(block)
    if docs:
        read_docs(docs)  # a missing or unreadable --docs fails before anything is written
    skipped: list[str] = []
    rows = aggregate(read_records(folder, skipped))
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    if not rows:
        raise ConfigError(f"{folder}: no result records (seed*.json) found" +
                          (f" ({len(skipped)} skipped as bad)" if skipped else ""))
    recipes = sorted({str(r["experiment"]) for r in rows})
    if len(recipes) > 1:  # one folder, one recipe: no table mixes two
        raise ConfigError(f"{folder} holds records of {len(recipes)} experiments ({', '.join(recipes)}); "
                          f"rank each recipe's records from their own folder")
    recipe = f" of experiment={rows[0]['experiment']}" if rows[0]["experiment"] else ""  # the table's recipe
    bench_files = benchmark_files(Path(benchmark) if benchmark else folder / "benchmark")
    bench: dict[tuple[str, str, int], dict[str, Any]] = {}
    for path in bench_files:
        bench.update(read_benchmark(path))
    join_benchmark(rows, bench)
    out = Path(out) if out else folder
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, COLUMNS + ["img_size", "val_images", "images_seen", "wall_s", "cpu"], out / "ranking.csv")
    cpus = sorted({str(r.get("cpu")) for r in rows})
    parts, charts = [], []
    budgets = sorted({r["epochs"] for r in rows})
    for epochs in budgets:
        sub = [r for r in rows if r["epochs"] == epochs]
        chart = ""
        if len(charts) < MAX_CHARTS:
            png = plot_ranking(sub, out / chart_name(epochs),
                               f"CIFAR-10, {_budget_name(epochs)}{recipe}, "
                               f"{sub[0].get('val_images')} validation images; "
                               f"{', '.join(cpus)}")
            charts.append(png)
            chart = f"\n\n![accuracy vs throughput, {_budget_name(epochs)}]({png.name})"
        hours = sum(r["wall_s"] for r in sub) / 3600
        runs = sum(len(r["seed_top1"]) for r in sub)  # one top-1 per record
        parts.append(f"**{_budget_name(epochs)}{recipe}** "
                     f"({runs} run{'s' if runs != 1 else ''} in {len(sub)} "
                     f"row{'s' if len(sub) != 1 else ''}, "
                     f"{hours:.1f} hours of training wall time, pauses included)\n\n{_fmt(sub)}{chart}")
    sources = ", ".join(f"`{p}`" for p in bench_files) or "the quiet benchmark (not measured yet)"
    text = (f"Records: `{folder}` ({', '.join(cpus)}). Accuracy from the records; images/s and peak memory from "
            f"{sources}.\n\n" + "\n\n".join(parts))
    if len(budgets) > MAX_CHARTS:
        text += f"\n\nCharts for the first {MAX_CHARTS} of {len(budgets)} budgets."
    atomic_write_text(out / "ranking.md", text + "\n")
    if docs:
        rel = Path(docs).resolve().parent
        linked = text
        for png in charts:
            linked = linked.replace(f"]({png.name})", f"]({os.path.relpath(png.resolve(), rel)})")
        replace_block(Path(docs), linked, block)
    return {"rows": rows, "md": out / "ranking.md", "csv": out / "ranking.csv", "charts": charts, "text": text,
            "skipped": skipped}
