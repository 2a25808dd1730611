#!/usr/bin/env python
"""The recipe's ablation table: every tuning run of ``vit_cifar`` + ``global`` on CIFAR-10, from its record.

Each tuning run is one ``train.py`` job with ``record_dir=results/cifar10_tuning/<tag>``; its record holds the
exact command. The table lists, per run, the levers it changes against the short recipe (the overrides of its
command beyond the common ones), top-1 with its 95 % interval over the validation images, flip-TTA top-1 where
it was measured, the top-1 after each epoch, and the difference to the short recipe's own runs
(``results/cifar10_short/3ep``, the mean of its seeds), and the step it takes from the run it builds on (the
earlier run sharing the most levers: what one lever adds). A run stopped early leaves ``<tag>/stopped.json`` (its
command, the epochs it finished and why it was stopped) and is listed with its curve. Runs are listed in tag order (the
order they were tried).

    python scripts/ablation.py                                  # print the table
    python scripts/ablation.py --docs docs/results.md           # refresh the generated block there
    python scripts/ablation.py --docs docs/results.md --check   # fail if the block differs from the records
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

from vitzoo.bench.docs_block import block_markers, refresh_block
from vitzoo.fileio import read_regular_text
from vitzoo.registry import ConfigError

BLOCK = "cifar10-ablation"  # the docs block: <!-- cifar10-ablation:begin --> ... <!-- cifar10-ablation:end -->
BEGIN, END = block_markers(BLOCK)
COMMON = ("experiment=", "export=", "benchmark.", "record_dir=", "+callbacks.flip_tta")  # not levers


def read(path: Path, field: str = "top1") -> dict:
    """One record (JSON object with ``field``) or a one-line error naming the file."""
    try:
        rec = json.loads(read_regular_text(path))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not a readable record ({type(e).__name__})") from None
    if not isinstance(rec, dict) or field not in rec:
        raise ConfigError(f"{path}: not a result record ({field} missing)")
    return rec


def curve(values) -> str:
    """Top-1 per epoch as ``52.3 / 63.5 / 67.8`` (– where the record has none)."""
    return " / ".join(f"{100 * v:.1f}" for v in values) if values else "–"


def lever_list(command: str) -> list[str]:
    """The overrides of a tuning command that change the recipe (``+model.stem=conv`` -> ``model.stem=conv``)."""
    words = shlex.split(command or "")[2:]  # drop "python train.py"
    return [w.lstrip("+") for w in words if not w.startswith(COMMON)]


def levers(command: str) -> str:
    """:func:`lever_list` as Markdown code spans."""
    return ", ".join(f"`{w}`" for w in lever_list(command)) or "(the short recipe)"


def parent(tag: str, mine: list[str], earlier: list[tuple[str, list[str]]]) -> tuple[str, list[str]] | None:
    """The earlier run this one builds on, and the levers it adds or changes against it.

    The parent sets no option this run leaves at the short recipe's value, and shares the most levers with it
    (on a tie the one with fewer levers, then the latest), so each row reads as one step:
    ``t09`` = ``t07`` + ``model.stem_full_res_convs=1``.

    Args:
        tag: this run's tag; mine: its levers; earlier: ``(tag, levers)`` of the runs tried before it.
    """
    keys = {w.split("=", 1)[0] for w in mine}
    best = None
    for other, theirs in earlier:
        if other < tag and {w.split("=", 1)[0] for w in theirs} <= keys:
            score = (len(set(theirs) & set(mine)), -len(theirs))
            if best is None or score >= best[0]:
                best = (score, other, [w for w in mine if w not in theirs])
    return None if best is None else (best[1], best[2])


def table(tuning: Path, baseline: Path) -> str:
    """The Markdown block: a header line naming machine and date, then one row per tuning run."""
    base = [read(p) for p in sorted(baseline.glob("seed*.json"))]
    runs = sorted(tuning.glob("*/vit_cifar/global/seed*.json"))
    if not base or not runs:
        raise ConfigError(f"no records under {baseline} or {tuning}/<tag>/vit_cifar/global/")
    ref = statistics.fmean(r["top1"] for r in base)
    recs = [(p.parts[-4], read(p)) for p in runs]
    stopped = [(p.parent.name, read(p, "val_top1_per_epoch")) for p in sorted(tuning.glob("*/stopped.json"))]
    cpus = sorted({r.get("cpu", "?") for _, r in recs})
    dates = sorted({r.get("date", "?") for _, r in recs})
    commits = sorted({str(r.get("commit")) for _, r in recs})
    lines = [
        f"> **Machine:** {', '.join(cpus)}, 2 cores · **Command:** each row's record (`command`); table: "
        f"`python scripts/ablation.py --docs docs/results.md` · **Commit:** {', '.join(commits)} · "
        f"**Date:** {dates[0] if dates[0] == dates[-1] else f'{dates[0]} to {dates[-1]}'}",
        "",
        f"`vit_cifar` + `global`, CIFAR-10, 3 epochs, seed 0, {recs[0][1].get('val_images')} validation images, "
        f"{recs[0][1].get('precision')}. Short recipe (`experiment=cifar10_short`): {100 * ref:.2f} % (mean of "
        f"{len(base)} seeds, {', '.join(sorted({str(r.get('cpu')) for r in base}))}).",
        "",
        "| run | levers on top of `experiment=cifar10_short` | top-1 % per epoch | top-1 % (95 % CI) | Δ short "
        "| builds on: adds (Δ) | flip TTA % | commit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    finished = {tag: r for tag, r in recs}
    done = [(tag, lever_list(r.get("command"))) for tag, r in recs]
    rows = [(tag, r, False) for tag, r in recs] + [(tag, r, True) for tag, r in stopped]
    for tag, r, halted in sorted(rows, key=lambda row: row[0]):
        if halted:
            lines.append(f"| {tag} | {levers(r.get('command'))} | {curve(r['val_top1_per_epoch'])} "
                         f"| stopped: {r.get('why', '')} | | | | |")
            continue
        low, high = r["top1_ci95"]
        tta = f"{100 * r['top1_tta']:.2f}" if isinstance(r.get("top1_tta"), float) else "–"
        step = parent(tag, lever_list(r.get("command")), done)
        adds = "–" if step is None else (f"{step[0]}: {', '.join(f'`{w}`' for w in step[1])} "
                                         f"({100 * (r['top1'] - finished[step[0]]['top1']):+.2f})")
        lines.append(f"| {tag} | {levers(r.get('command'))} | {curve(r.get('top1_per_epoch'))} "
                     f"| {100 * r['top1']:.2f} ({100 * low:.1f}–{100 * high:.1f}) | {100 * (r['top1'] - ref):+.2f} "
                     f"| {adds} | {tta} | {r.get('commit')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tuning", default="results/cifar10_tuning", help="folder of tuning records (<tag>/...)")
    p.add_argument("--baseline", default="results/cifar10_short/3ep/vit_cifar/global",
                   help="the short recipe's records")
    p.add_argument("--docs", default=None, help="Markdown file whose generated ablation block is replaced")
    p.add_argument("--check", action="store_true", help="with --docs: fail if the block differs, write nothing")
    a = p.parse_args(argv)
    try:
        block = table(Path(a.tuning), Path(a.baseline))
        if not a.docs:
            print(block)
            return 0
        return refresh_block(a.docs, block, BLOCK, a.check)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
