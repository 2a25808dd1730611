"""Targets for a benchmark run, each reported met / missed / not measured (never asserted: tests don't time).

    python tools/goals.py outputs/benchmark/<timestamp>    # -> goals.csv, goals.md, a section of report.md

* models: vitzoo's ViT (``global``) and Swin (``window``) at least as fast as their timm twins;
* layers at :data:`GOAL_TOKENS` tokens: every linear-cost backend keeps at least :data:`GOAL_SHARE`
  of its analytic FLOPs advantage over ``global`` as a time advantage; the neighbourhood family and
  ``performer`` reach fixed speedups (:data:`SPEEDUP_GOALS`); no linear-cost backend needs more peak
  memory than ``global``;
* layers at :data:`LONG_TOKENS` tokens: every linear-cost backend at least :data:`LONG_SPEEDUP`× faster.

A speed goal's verdict follows the ratio of the median times; where the two sides were timed in alternating
blocks, the row also shows the range of the back-to-back pairs' ratios, and a verdict whose pairs fall on both
sides of the target is marked "within noise".
"""
from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from vitzoo.bench.options import BenchOptions
from vitzoo.bench.references import MODEL_REFERENCES
from vitzoo.bench.report import markdown_table, write_csv
from vitzoo.fileio import atomic_write_text, read_regular_text

GOAL_COLUMNS = ["goal", "measured", "target", "status"]

GOAL_TOKENS = 4096
GOAL_SHARE = 0.5  # time ratio / FLOPs ratio of a linear-cost backend at GOAL_TOKENS
SPEEDUP_GOALS = {"local": 5.0, "dilated": 5.0, "longformer": 5.0, "global_tokens": 5.0, "bigbird": 5.0,
                 "performer": 4.5}  # time ratio over global at GOAL_TOKENS (performer: the LRA paper's 5.7x at 4K)
LONG_TOKENS = 16384
LONG_SPEEDUP = 10.0

Rows = Sequence[Mapping[str, Any]]
Goal = dict[str, Any]


def _goal(goal: str, measured: str, target: str, met: Optional[bool], why: str = "", near: bool = False) -> Goal:
    """One goal row; ``near``: the paired blocks' ratios fall on both sides of the target (the verdict is noise)."""
    status = ("met" if met else "missed") if met is not None else f"not measured ({why})"
    if met is not None and near:
        status += " (within noise: the paired blocks straddle the target)"
    return {"goal": goal, "measured": measured, "target": target, "status": status}


def _spread(r: Mapping[str, Any], key: str, scale: float = 1.0) -> Optional[tuple[float, float]]:
    """Smallest and largest ratio of the paired (back-to-back) blocks, ``r[key_min], r[key_max]``, divided by
    ``scale``; None where the row has no pairs (separate processes)."""
    lo, hi = r.get(f"{key}_min"), r.get(f"{key}_max")
    return None if lo is None or hi is None else (lo / scale, hi / scale)


def _span(spread: Optional[tuple[float, float]], unit: str = "") -> str:
    return "" if spread is None else f"{spread[0]:.2f}–{spread[1]:.2f}{unit}"


def _straddles(spread: Optional[tuple[float, float]], target: float) -> bool:
    """Some paired blocks fall short of ``target`` and some reach it."""
    return spread is not None and spread[0] < target <= spread[1]


def _model_goals(refs: Rows, opts: BenchOptions) -> list[Goal]:
    """vitzoo ViT / Swin at least as fast as timm's, per phase and measured case."""
    goals: list[Goal] = []
    for family, (backend, ref_name) in MODEL_REFERENCES.items():
        rows = [r for r in refs if r.get("level") == "model" and r.get("backend") == backend]
        for phase in ("train", "infer"):
            goal = f"vitzoo {family} `{backend}` {phase} speed vs {ref_name} (amp {opts.amp})"
            if not rows:
                why = ("--no-references" if not opts.references else "models mode off" if opts.mode == "layers"
                       else f"needs a {family}_* model and the {backend} backend")
                goals.append(_goal(goal, "", ">= 1.00", None, why))
            for r in rows:
                v, spread = r.get(f"{phase}_speed_ratio"), _spread(r, f"{phase}_speed_ratio")
                measured = "" if v is None else f"{v:.2f} ({_span(spread)})" if spread else f"{v:.2f}"
                met = None if v is None else v >= 1.0
                goals.append(_goal(f"{goal} ({r.get('case', '')})", measured, ">= 1.00", met, str(r.get("status")),
                                   _straddles(spread, 1.0)))
    return goals


def _ratio_goals(at: Rows, tokens: int, g: Optional[Mapping[str, Any]]) -> list[Goal]:
    """Share of the FLOPs ratio kept, and the fixed speedups, at ``tokens``."""
    goals: list[Goal] = []
    why_global = f"global: {g.get('status') if g else 'not run'}"
    for r in at:
        b, ok = r["backend"], r.get("time_ratio") is not None
        why = r.get("status") if r.get("status") != "ok" else why_global
        spread = _spread(r, "time_ratio")  # the paired blocks' speedups
        how = (f", {r.get('ratio_method')}" + (f" {_span(spread, 'x')}" if spread else "")) if ok else ""
        if r.get("linear_cost"):
            share = ok and r.get("efficiency") is not None
            shares = _spread(r, "time_ratio", r["flops_ratio"]) if share else None
            goals.append(_goal(f"`{b}` at {tokens} tokens: time ratio / FLOPs ratio over global",
                               f"{r['efficiency']:.2f} ({r['time_ratio']:.2f}x of {r['flops_ratio']:.2f}x{how})"
                               if share else "", f">= {GOAL_SHARE}", r["efficiency"] >= GOAL_SHARE if share else None,
                               why, _straddles(shares, GOAL_SHARE)))
        if b in SPEEDUP_GOALS:
            goals.append(_goal(f"`{b}` at {tokens} tokens: speedup over global",
                               f"{r['time_ratio']:.2f}x{how}" if ok else "", f">= {SPEEDUP_GOALS[b]}",
                               r["time_ratio"] >= SPEEDUP_GOALS[b] if ok else None, why,
                               _straddles(spread, SPEEDUP_GOALS[b])))
    return goals


def _memory_goals(at: Rows, tokens: int, g: Optional[Mapping[str, Any]]) -> list[Goal]:
    """Peak memory of each linear-cost backend at most ``global``'s."""
    g_mb = g.get("peak_mb") if g and g.get("status") == "ok" else None
    return [_goal(f"`{r['backend']}` at {tokens} tokens: peak memory vs global",
                  f"{r['peak_mb']:.0f} MB vs {g_mb:.0f} MB" if g_mb and r.get("peak_mb") else "",
                  "<= global", r["peak_mb"] <= g_mb if g_mb and r.get("peak_mb") else None,
                  "global or this backend not measured")
            for r in at if r.get("linear_cost")]


def _long_goals(at: Rows, tokens: int) -> list[Goal]:
    """Every linear-cost backend at least :data:`LONG_SPEEDUP`× faster than ``global`` at ``tokens``."""
    return [_goal(f"`{r['backend']}` at {tokens} tokens: speedup over global",
                  f"{r['time_ratio']:.2f}x, {r.get('ratio_method')}" if r.get("time_ratio") else "",
                  f">= {LONG_SPEEDUP}", r["time_ratio"] >= LONG_SPEEDUP if r.get("time_ratio") else None,
                  str(r.get("status")) if r.get("status") != "ok" else "global not measured")
            for r in at if r.get("linear_cost")]


def _layer_goals(layers: Rows) -> list[Goal]:
    goals: list[Goal] = []
    for tokens, make in ((GOAL_TOKENS, lambda at, g: _ratio_goals(at, GOAL_TOKENS, g) + _memory_goals(
            at, GOAL_TOKENS, g)), (LONG_TOKENS, lambda at, g: _long_goals(at, LONG_TOKENS))):
        at = [r for r in layers if r.get("tokens") == tokens]
        if not at:
            goals.append(_goal(f"layer goals at {tokens} tokens", "", "", None,
                               f"{tokens} not in --tokens or layers mode off"))
            continue
        goals += make(at, next((r for r in at if r.get("backend") == "global"), None))
    return goals


def goal_rows(models: Rows, layers: Rows, refs: Rows, opts: BenchOptions) -> list[Goal]:
    """The goals, each met / missed / not measured (reported, never asserted).

    Args:
        models: model rows (unused by the current goals; kept so every table can feed a goal).
        layers: layer rows, with ``time_ratio`` / ``efficiency`` already added.
        refs: reference rows.
        opts: the run's options (to say why a goal was not measured).
    """
    return _model_goals(refs, opts) + _layer_goals(layers)


def write_goals(out: Path) -> list[Goal]:
    """The goals of the benchmark run in ``out`` (its ``results.json``), written as ``goals.csv``,
    ``goals.md`` and a ``## goals`` section of ``report.md``.

    Args:
        out: a folder written by :func:`vitzoo.bench.run.run_benchmark`.
    """
    result = json.loads((out / "results.json").read_text())
    opts = BenchOptions(**result["environment"]["options"])
    goals = goal_rows(result["models"], result["layers"], result["references"], opts)
    write_csv(goals, GOAL_COLUMNS, out / "goals.csv")
    table = markdown_table(goals, GOAL_COLUMNS)
    atomic_write_text(out / "goals.md", table + "\n")
    report = read_regular_text(out / "report.md") if (out / "report.md").exists() else ""
    atomic_write_text(out / "report.md", f"{report}\n## goals\n\n{table}\n")
    return goals


if __name__ == "__main__":
    print(markdown_table(write_goals(Path(sys.argv[1])), GOAL_COLUMNS))
