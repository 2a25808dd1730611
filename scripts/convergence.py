#!/usr/bin/env python
"""The fast recipe's convergence point: the per-epoch validation curve of one long run, with the ranking's
10-epoch result marked on it, as a chart and a Markdown block.

The long run is one ``train.py`` job (its record holds ``top1_per_epoch`` and the command that re-runs it):

    python train.py experiment=zoo_cifar10 trainer.max_epochs=50 record_dir=results/cifar10/50ep \\
        hydra.run.dir=outputs/convergence ckpt_path=auto        # resumes where it stopped when run again
    python scripts/convergence.py                               # print the block, write the chart
    python scripts/convergence.py --docs docs/results.md        # refresh the generated block there
    python scripts/convergence.py --docs docs/results.md --check   # fail if the block differs from the records
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Optional

from vitzoo.bench.docs_block import block_markers, refresh_block
from vitzoo.fileio import atomic_write_bytes, read_regular_text
from vitzoo.registry import ConfigError

BLOCK = "cifar10-convergence"  # the docs block: <!-- cifar10-convergence:begin --> ... <!-- cifar10-convergence:end -->
BEGIN, END = block_markers(BLOCK)
CHART = "convergence_global.png"  # written beside the long run's budget folder (results/cifar10/)


def read(path: Path) -> dict:
    """One record with its per-epoch curve, or a one-line error naming the file."""
    try:
        rec = json.loads(read_regular_text(path))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not a readable record ({type(e).__name__})") from None
    curve = rec.get("top1_per_epoch") if isinstance(rec, dict) else None
    if not isinstance(curve, list) or not curve or not all(isinstance(v, (int, float)) for v in curve):
        raise ConfigError(f"{path}: no top1_per_epoch curve")
    return rec


def chart(curve: list[float], marks: list[float], title: str) -> bytes:
    """PNG bytes: top-1 % per epoch of the long run; each 10-epoch run's final top-1 as a point at epoch 10.

    Args:
        curve: top-1 (fraction) after each epoch of the long run.
        marks: final top-1 (fraction) of each 10-epoch run of the same recipe.
        title: the chart's title.
    """
    import io

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=110)
    ax = fig.add_subplot()
    epochs = list(range(1, len(curve) + 1))
    ax.plot(epochs, [100 * v for v in curve], marker=".", label=f"{len(curve)}-epoch run (validation top-1)")
    if marks:
        ax.scatter([10] * len(marks), [100 * v for v in marks], color="C3", zorder=3,
                   label=f"10-epoch run{'s' if len(marks) > 1 else ''} (the ranking's budget)")
        ax.axvline(10, color="C3", alpha=0.3)
    ax.set(xlabel="epoch", ylabel="top-1 % (5,000 validation images)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def block(long_run: Path, ten: list[Path], chart_link: str) -> str:
    """The Markdown block: the measurement line, the curve as a table, the 10-epoch comparison and the chart.

    Args:
        long_run: the long run's record; ten: the 10-epoch records of the same recipe and model;
        chart_link: the chart's path as the docs link it.
    """
    rec = read(long_run)
    curve = rec["top1_per_epoch"]
    finals = [read(p)["top1"] for p in ten]
    rows = [curve[i:i + 10] for i in range(0, len(curve), 10)]
    lines = [
        f"> **Machine:** {rec.get('cpu')}, 2 cores · **Command:** `{rec.get('command')}`; block: "
        f"`python scripts/convergence.py --docs docs/results.md` · **Commit:** {rec.get('commit')} · "
        f"**Date:** {rec.get('date')}",
        "",
        f"`{rec.get('model')}` + `{rec.get('attention')}`, `experiment={rec.get('experiment')}`, "
        f"{len(curve)} epochs ({'finished' if len(curve) == rec.get('epochs') else 'in progress'}), seed "
        f"{rec.get('seed')}, {rec.get('val_images')} validation images, {rec.get('precision')}: "
        f"top-1 {100 * curve[-1]:.2f} % after the last epoch, best {100 * max(curve):.2f} %.",
        "",
        "| epochs | " + " | ".join(f"+{i}" for i in range(1, 11)) + " |",
        "|---|" + "---|" * 10,
    ]
    for k, row in enumerate(rows):
        lines.append(f"| {10 * k} | " + " | ".join(f"{100 * v:.1f}" for v in row) + " |" * (11 - len(row)))
    if finals:
        mean = statistics.fmean(finals)
        lines += ["", f"The 10-epoch runs of the ranking (same recipe, its cosine schedule ending at epoch 10) reach "
                      f"{100 * mean:.2f} % (mean of {len(finals)}): {100 * (max(curve) - mean):.2f} points under the "
                      f"long run's best."]
    lines += ["", f"![validation top-1 per epoch]({chart_link})"]
    return "\n".join(lines)


def chart_path(record: Path) -> Path:
    """The chart beside the long run's budget folder: ``results/cifar10/50ep/<model>/<attention>/seed0.json`` ->
    ``results/cifar10/convergence_global.png``."""
    return record.parents[3] / CHART


def docs_text(record: Path, ten: Path, docs: Optional[Path] = None) -> str:
    """The block for ``docs`` (its chart link relative to that file; None: as a path from here).

    Args:
        record: the long run's record; ten: the folder of the 10-epoch records; docs: the Markdown file.
    """
    png = chart_path(record)
    link = os.path.relpath(png.resolve(), docs.resolve().parent) if docs else str(png)
    return block(record, sorted(ten.glob("seed*.json")), link)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--record", default="results/cifar10/50ep/vit_cifar/global/seed0.json", help="the long run")
    p.add_argument("--ten", default="results/cifar10/10ep/vit_cifar/global", help="folder of the 10-epoch records")
    p.add_argument("--docs", default=None, help="Markdown file whose generated convergence block is replaced")
    p.add_argument("--check", action="store_true", help="with --docs: fail if the block differs, write nothing")
    a = p.parse_args(argv)
    try:
        record, ten = Path(a.record), Path(a.ten)
        text = docs_text(record, ten, Path(a.docs) if a.docs else None)
        if not a.docs:
            print(text)
        else:
            status = refresh_block(a.docs, text, BLOCK, a.check)
            if status or a.check:
                return status
        if not a.check:
            rec = read(record)
            marks = [read(q)["top1"] for q in sorted(ten.glob("seed*.json"))]
            atomic_write_bytes(chart_path(record), chart(rec["top1_per_epoch"], marks,
                                                         f"CIFAR-10, {rec.get('model')} + {rec.get('attention')}, "
                                                         f"experiment={rec.get('experiment')}"))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
