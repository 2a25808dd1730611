"""docs/results.md's memory table: the predicted training peak beside the measured one, backend × tokens.

Its data are the ``--memory-only`` benchmark runs under ``results/benchmark/memory/`` (each run's folder holds its
``models.csv`` and ``environment.json``; a row's precision is its ``amp``). For each model a table: one row per
backend, one column per grid token count and precision, each cell ``predicted / measured MB (measured ÷
predicted)``, and the two largest saved tensors of the backend's ``memory()`` at the largest token count
(:mod:`vitzoo.bench.memory_rows` defines the prediction). ``python scripts/gen_docs.py`` writes it between
``<!-- memory-peak:begin -->`` and ``<!-- memory-peak:end -->``; ``--check`` compares.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from vitzoo.bench.results_tables import markdown, read_csv, tokens_text, value
from vitzoo.fileio import read_regular_text
from vitzoo.registry import ConfigError

FOLDER = Path("results/benchmark/memory")  # the runs' --out folders, relative to the checkout
BLOCK = "memory-peak"
TOLERANCE = 0.15  # a prediction within 15 % of the measured peak counts as met
PRECISIONS = {"none": "fp32", "bf16": "bf16"}  # the benchmark's --amp -> the table's name


def runs(root: Path) -> list[Path]:
    """The run folders under ``root/FOLDER`` (the folder itself included) that hold a ``models.csv``."""
    base = root / FOLDER
    return sorted(p.parent for p in base.glob("**/models.csv")) if base.is_dir() else []


def read_run(folder: Path) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """The rows of ``folder/models.csv`` and its ``environment.json``, else one line naming the folder."""
    try:
        env = json.loads(read_regular_text(folder / "environment.json"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{folder}: no readable environment.json beside models.csv ({type(e).__name__})") from None
    return read_csv(folder / "models.csv")[1], env


def read_runs(folders: Sequence[Path]) -> tuple[list[dict[str, str]], list[str]]:
    """The rows of every run in ``folders``, each with its ``precision`` (fp32 or bf16), and each run's
    :func:`source_line`."""
    rows, sources = [], []
    for folder in folders:
        run_rows, env = read_run(folder)
        rows += [{**r, "precision": PRECISIONS.get(r.get("amp") or "none", r.get("amp"))} for r in run_rows]
        sources.append(source_line(env))
    return rows, sources


def source_line(env: Mapping[str, Any]) -> str:
    """One run's machine, command, commit and date, from its ``environment.json``."""
    machine = env.get("gpu") if env.get("device") == "cuda" else f"{env.get('cpu_model')}, {env.get('cpu_count')} cores"
    return (f"> **Machine:** {machine}, torch {env.get('torch')} · **Command:** `{env.get('command', 'not recorded')}`"
            f" · **Commit:** `{env.get('git_commit')}` · **Date:** {str(env.get('date', 'not recorded'))[:10]}")


def grid_tokens(row: Mapping[str, str]) -> int:
    """The row's grid tokens, the class token left out (``65`` -> ``64``)."""
    return math.isqrt(int(row["tokens"])) ** 2


def mb(x: Any) -> str:
    """A figure in MB: no decimals from 100 on, one below."""
    return f"{x:.0f}" if isinstance(x, (int, float)) and x >= 100 else f"{x:.1f}" if isinstance(x, (int, float)) else ""


def cell(row: Optional[Mapping[str, str]]) -> str:
    """``predicted / measured (ratio)`` of a row, its status where it did not run, empty where there is none."""
    if row is None:
        return ""
    if row.get("status") != "ok":
        return str(row.get("status") or "no status").split(":")[0]
    predicted, measured = value(row.get("predicted_peak_mb") or ""), value(row.get("train_peak_mb") or "")
    if not isinstance(predicted, (int, float)):
        return f"— / {mb(measured)}"
    return f"{mb(predicted)} / {mb(measured)} ({measured / predicted:.2f})"


def ratios(rows: Sequence[Mapping[str, str]], other: bool = False) -> list[tuple[float, str]]:
    """``(measured ÷ predicted, where)`` of every row with both figures.

    Args:
        rows: the rows; other: add the row's measured ``resident_other_mb`` (memory no tensor holds) to the
            prediction, less its ``predicted_runtime_mb`` (the kernel caches the prediction holds already).
    """
    out = []
    for r in rows:
        predicted, measured = value(r.get("predicted_peak_mb") or ""), value(r.get("train_peak_mb") or "")
        extra = value(r.get("resident_other_mb") or "") if other else None
        runtime = value(r.get("predicted_runtime_mb") or "")
        if isinstance(extra, (int, float)) and isinstance(runtime, (int, float)):
            extra = max(0.0, extra - runtime)
        if isinstance(predicted, (int, float)) and isinstance(extra, (int, float)):
            predicted += extra
        if r.get("status") == "ok" and isinstance(predicted, (int, float)) and predicted > 0:
            where = f"`{r['backend']}` {r['model']} {tokens_text(grid_tokens(r))} tokens {r['precision']}"
            out.append((measured / predicted, where))
    return out


def model_table(rows: Sequence[Mapping[str, str]], order: Sequence[str]) -> str:
    """The Markdown table of one model's rows (each with its ``precision``).

    Args:
        rows: the model's rows; order: backend names in the order to show (those without rows are left out).
    """
    tokens = sorted({grid_tokens(r) for r in rows if r.get("tokens")})
    precisions = [p for p in PRECISIONS.values() if any(r["precision"] == p for r in rows)]
    by = {(r["backend"], grid_tokens(r), r["precision"]): r for r in rows if r.get("tokens")}
    top = tokens[-1] if tokens else None
    header = (["backend"] + [f"{tokens_text(n)} tokens, {p}" for n in tokens for p in precisions]
              + [f"largest saved tensors, {tokens_text(top)} tokens" if top else "largest saved tensors"])
    cells = []
    for name in [b for b in order if any(k[0] == b for k in by)]:
        done = [by[(name, top, p)] for p in precisions if by.get((name, top, p), {}).get("status") == "ok"]
        saved = next((r["predicted_top_saved"] for r in done if r.get("predicted_top_saved")), "")
        cells.append([f"`{name}`"] + [cell(by.get((name, n, p))) for n in tokens for p in precisions] + [saved or ""])
    return markdown(header, cells)


def block_text(root: Path, order: Sequence[str]) -> str:
    """The block's Markdown: the runs' source lines, one table per model, and how many cells are within 15 %.

    Args:
        root: the checkout; order: every registered backend's name, in the order the tables list them.
    """
    rows, sources = read_runs(runs(root))
    parts = sources[:]
    models = list(dict.fromkeys(r["model"] for r in rows))
    for model in models:
        parts += ["", f"**{model}**: predicted / measured training peak in MB (measured ÷ predicted)", "",
                  model_table([r for r in rows if r["model"] == model], order)]
    checked = ratios(rows)
    outside = sorted((q, w) for q, w in checked if abs(q - 1) > TOLERANCE)
    summary = (f"{len(checked) - len(outside)} of {len(checked)} configurations within "
               f"{TOLERANCE:.0%} of the prediction (measured ÷ predicted "
               f"{min(q for q, _ in checked):.2f}–{max(q for q, _ in checked):.2f})" if checked
               else "No configuration has both a predicted and a measured peak")
    if outside:
        summary += "; outside: " + ", ".join(f"{w} ({q:.2f})" for q, w in outside)
    summary += "."
    if any(r.get("resident_other_mb") for r in rows):
        plus = ratios(rows, other=True)
        summary += (f" With what the process keeps beyond its tensors and the predicted kernel caches added to "
                    f"the prediction (measured after the steps, `resident_other_mb` − `predicted_runtime_mb`): "
                    f"{sum(abs(q - 1) <= TOLERANCE for q, _ in plus)} of {len(plus)} within 15 %.")
    return "\n".join(parts + ["", summary.replace("15%", "15 %")])


SPARSE_FOLDER = Path("results/benchmark/sparse_memory")  # the --memory-only run of the sparse patterns and global
SPARSE_BLOCK = "memory-sparse"
SPARSE_BOUND = 1.2  # a sparse pattern's measured peak at most this many times global's


def sparse_text(root: Path) -> str:
    """docs/results.md's table of the sparse patterns' measured training peaks against ``global``'s, from the
    run(s) under :data:`SPARSE_FOLDER`: one row per backend, one column per precision (``measured MB (÷ global)``),
    the predicted peak beside it and the two largest saved tensors; then how many are within :data:`SPARSE_BOUND`.

    Args:
        root: the checkout.
    """
    rows, sources = read_runs(sorted(p.parent for p in (root / SPARSE_FOLDER).glob("**/models.csv")))
    ok = {(r["backend"], r["precision"]): r for r in rows if r.get("status") == "ok"}
    precisions = [p for p in PRECISIONS.values() if (("global", p) in ok)]
    names = list(dict.fromkeys(["global"] + [r["backend"] for r in rows]))
    header = (["backend"] + [f"{p}: measured MB (÷ global)" for p in precisions]
              + [f"{p}: predicted MB" for p in precisions] + ["largest saved tensors"])
    cells, over, checked = [], [], 0
    for name in names:
        line = [f"`{name}`"]
        for p in precisions:
            r = ok.get((name, p))
            if r is None:
                line.append("")
                continue
            q = float(r["train_peak_mb"]) / float(ok[("global", p)]["train_peak_mb"])
            line.append(f"{mb(float(r['train_peak_mb']))} ({q:.2f})")
            if name != "global":
                checked += 1
                over += [f"`{name}` {p} ({q:.2f})"] if q > SPARSE_BOUND else []
        line += [mb(value(ok[(name, p)].get("predicted_peak_mb") or "")) if (name, p) in ok else "" for p in precisions]
        line.append(next((ok[(name, p)].get("predicted_top_saved") or "" for p in precisions if (name, p) in ok), ""))
        cells.append(line)
    summary = (f"{checked - len(over)} of {checked} sparse configurations at most {SPARSE_BOUND:g}× `global`'s "
               f"measured peak" + (f"; over: {', '.join(over)}." if over else "."))
    return "\n".join(sources + ["", markdown(header, cells), "", summary])
