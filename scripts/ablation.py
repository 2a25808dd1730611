#!/usr/bin/env python
"""The recipe's ablation tables: every tuning run of ``vit_cifar`` + ``global`` on CIFAR-10, from its record.

Each tuning run is one ``train.py`` job with ``record_dir=results/cifar10_tuning/<tag>``; its record holds the
exact command. One table per training length (``--epochs``: the runs whose record has that many epochs) lists, per
run, the levers it changes against the short recipe (the overrides of its command beyond the common ones), top-1
with its 95 % interval over the validation images, flip-TTA top-1 where it was measured, the top-1 after each
epoch, the difference to the short recipe's own runs at that length (``--baseline``, the mean of its seeds), and
the step it takes from the run it builds on (the earlier run of the table sharing the most levers: what one lever
adds). ``--reference`` adds the shipped recipe's own record at that length as the table's first row, with the
levers of the tuning run that defines it (``--recipe-run``), so the runs on top of it read as steps from it. A
run stopped early leaves ``<tag>/stopped.json`` (its command, the epochs it finished and why it was stopped) and
is listed with its curve. Runs are listed in tag order (the order they were tried).

    python scripts/ablation.py                                  # print the 3-epoch table
    python scripts/ablation.py --docs docs/results.md           # refresh the generated block there
    python scripts/ablation.py --docs docs/results.md --check   # fail if the block differs from the records
    python scripts/ablation.py --epochs 10 --baseline results/cifar10_short/10ep/vit_cifar/global \
        --reference results/cifar10/10ep/vit_cifar/global --recipe-run t15_fullres2_crop2 --docs docs/results.md
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
SHORT_EPOCHS = 3  # the short recipe's length: its table is BLOCK, a longer one BLOCK-<epochs>ep
RECIPE_RUN = "t15_fullres2_crop2"  # the tuning run whose levers experiment=cifar10_fast ships (a test holds them equal)
LONG_EPOCHS = 10  # the ranking's length: its table starts from the shipped recipe's own record
LONG_BASELINE = "results/cifar10_short/10ep/vit_cifar/global"  # the short recipe at LONG_EPOCHS
LONG_REFERENCE = "results/cifar10/10ep/vit_cifar/global"  # the shipped recipe at LONG_EPOCHS (the ranking's row)
COMMON = ("experiment=", "export=", "benchmark.", "record_dir=", "hydra.", "+callbacks.flip_tta",  # not levers:
          "trainer.max_epochs=")  # the settings every tuning run shares, and the length, which each table fixes


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
    """The overrides of a tuning command that change the recipe (``+model.stem=conv`` -> ``model.stem=conv``); a key
    given twice keeps its last value, as Hydra does, at its first place."""
    words = shlex.split(command or "")[2:]  # drop "python train.py"
    last = {w.lstrip("+").split("=", 1)[0]: w.lstrip("+") for w in words if not w.startswith(COMMON)}
    return list(last.values())


def levers(command: str) -> str:
    """:func:`lever_list` as Markdown code spans."""
    return ", ".join(f"`{w}`" for w in lever_list(command)) or "(the short recipe)"


def parent(mine: list[str], earlier: list[tuple[str, list[str]]]) -> tuple[str, list[str]] | None:
    """The earlier run this one builds on, and the levers it adds or changes against it.

    The parent sets no option this run leaves at the short recipe's value, and shares the most levers with it
    (on a tie the one with fewer levers, then the latest), so each row reads as one step:
    ``t09`` = ``t07`` + ``model.stem_full_res_convs=1``.

    Args:
        mine: this run's levers; earlier: ``(tag, levers)`` of the runs tried before it, in order.
    """
    keys = {w.split("=", 1)[0] for w in mine}
    best = None
    for other, theirs in earlier:
        if {w.split("=", 1)[0] for w in theirs} <= keys:
            score = (len(set(theirs) & set(mine)), -len(theirs))
            if best is None or score >= best[0]:
                best = (score, other, [w for w in mine if w not in theirs])
    return None if best is None else (best[1], best[2])


def epochs_of(record: dict) -> int:
    """The training length of a finished record (``epochs``) or a stopped one (``epochs_planned``; the short
    recipe's length where a record predates both fields)."""
    return int(record.get("epochs") or record.get("epochs_planned") or SHORT_EPOCHS)


def block_name(epochs: int) -> str:
    """The docs block of the ``epochs`` table: :data:`BLOCK` for the short length, ``BLOCK-<epochs>ep`` else."""
    return BLOCK if epochs == SHORT_EPOCHS else f"{BLOCK}-{epochs}ep"


def header(recs: list[tuple[str, dict]], base: list[dict], epochs: int, argv: str) -> list[str]:
    """The provenance line, the setting and the short recipe's figure, and the table's column row."""
    cpus = sorted({r.get("cpu", "?") for _, r in recs})
    dates = sorted({r.get("date", "?") for _, r in recs})
    commits = sorted({str(r.get("commit")) for _, r in recs})
    ref = statistics.fmean(r["top1"] for r in base)
    return [
        f"> **Machine:** {', '.join(cpus)}, 2 cores · **Command:** each row's record (`command`); table: "
        f"`python scripts/ablation.py{argv} --docs docs/results.md` · **Commit:** {', '.join(commits)} · "
        f"**Date:** {dates[0] if dates[0] == dates[-1] else f'{dates[0]} to {dates[-1]}'}",
        "",
        f"`vit_cifar` + `global`, CIFAR-10, {epochs} epochs, seed 0, {recs[0][1].get('val_images')} validation "
        f"images, {recs[0][1].get('precision')}. Short recipe (`experiment=cifar10_short`) at {epochs} epochs: "
        f"{100 * ref:.2f} % ({f'mean of {len(base)} seeds' if len(base) > 1 else 'one seed'}, "
        f"{', '.join(sorted({str(r.get('cpu')) for r in base}))}).",
        "",
        "| run | levers on top of `experiment=cifar10_short` | top-1 % per epoch | top-1 % (95 % CI) | Δ short "
        "| builds on: adds (Δ) | flip TTA % | commit |",
        "|---|---|---|---|---|---|---|---|",
    ]


def row(tag: str, r: dict, mine: list[str], ref: float, step: tuple[str, list[str]] | None,
        finished: dict[str, dict]) -> str:
    """One finished run's table row (``step``: the run it builds on and the levers it adds)."""
    low, high = r["top1_ci95"]
    tta = f"{100 * r['top1_tta']:.2f}" if isinstance(r.get("top1_tta"), float) else "–"
    added = ", ".join(f"`{w}`" for w in step[1]) if step else ""
    adds = "–" if step is None else (f"{step[0]}: {added or 'the same levers'} "
                                     f"({100 * (r['top1'] - finished[step[0]]['top1']):+.2f})")
    shown = ", ".join(f"`{w}`" for w in mine) or "(the short recipe)"
    return (f"| {tag} | {shown} | {curve(r.get('top1_per_epoch'))} | {100 * r['top1']:.2f} "
            f"({100 * low:.1f}–{100 * high:.1f}) | {100 * (r['top1'] - ref):+.2f} | {adds} | {tta} "
            f"| {r.get('commit')} |")


def table(tuning: Path, baseline: Path, epochs: int = SHORT_EPOCHS, reference: Path | None = None,
          recipe_run: str | None = None) -> str:
    """The Markdown block of the ``epochs`` table: a header line naming machine and date, then one row per run.

    Args:
        tuning: the folder of tuning runs (``<tag>/vit_cifar/global/seed0.json`` or ``<tag>/stopped.json``).
        baseline: the short recipe's records at this length (``seed*.json``).
        epochs: the training length whose runs the table lists.
        reference: the shipped recipe's record folder at this length (its first row, tagged ``recipe``).
        recipe_run: with ``reference``: the tag of the tuning run whose levers define the shipped recipe.
    """
    base = [read(p) for p in sorted(baseline.glob("seed*.json"))]
    every = [(p.parts[-4], read(p)) for p in sorted(tuning.glob("*/vit_cifar/global/seed*.json"))]
    recs = [(tag, r) for tag, r in every if epochs_of(r) == epochs]
    stopped = [(p.parent.name, read(p, "val_top1_per_epoch")) for p in sorted(tuning.glob("*/stopped.json"))]
    stopped = [(tag, r) for tag, r in stopped if epochs_of(r) == epochs]
    if not base or not recs:
        raise ConfigError(f"no {epochs}-epoch records under {baseline} or {tuning}/<tag>/vit_cifar/global/")
    argv = "" if epochs == SHORT_EPOCHS else f" --epochs {epochs} --baseline {baseline}"
    done: list[tuple[str, list[str]]] = []
    finished = dict(recs)
    if reference is not None:
        defining = dict(every).get(recipe_run or "")
        recipe = [read(p) for p in sorted(reference.glob("seed0.json"))]
        if defining is None or not recipe:
            raise ConfigError(f"--reference needs {reference}/seed0.json and --recipe-run naming a tuning run "
                              f"(got {recipe_run!r})")
        argv += f" --reference {reference} --recipe-run {recipe_run}"
        finished["recipe"] = recipe[0]
        done.append(("recipe", lever_list(defining.get("command"))))
        recs_shown = [("recipe", recipe[0])]
    else:
        recs_shown = []
    ref = statistics.fmean(r["top1"] for r in base)
    lines = header(recs + recs_shown, base, epochs, argv)
    if reference is not None:
        lines.append(row("recipe", recipe[0], done[0][1], ref, None, finished))
    rows = [(tag, r, False) for tag, r in recs] + [(tag, r, True) for tag, r in stopped]
    for tag, r, halted in sorted(rows, key=lambda item: item[0]):
        mine = lever_list(r.get("command"))
        if halted:
            lines.append(f"| {tag} | {levers(r.get('command'))} | {curve(r['val_top1_per_epoch'])} "
                         f"| stopped: {r.get('why', '')} | | | | |")
            continue
        lines.append(row(tag, r, mine, ref, parent(mine, done), finished))
        done.append((tag, mine))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tuning", default="results/cifar10_tuning", help="folder of tuning records (<tag>/...)")
    p.add_argument("--baseline", default="results/cifar10_short/3ep/vit_cifar/global",
                   help="the short recipe's records at the table's length")
    p.add_argument("--epochs", type=int, default=SHORT_EPOCHS, help="the training length whose runs are listed")
    p.add_argument("--reference", default=None, help="the shipped recipe's record folder at that length (first row)")
    p.add_argument("--recipe-run", default=None, help="with --reference: the tuning run that defines the recipe")
    p.add_argument("--docs", default=None, help="Markdown file whose generated ablation block is replaced")
    p.add_argument("--check", action="store_true", help="with --docs: fail if the block differs, write nothing")
    a = p.parse_args(argv)
    try:
        block = table(Path(a.tuning), Path(a.baseline), a.epochs,
                      Path(a.reference) if a.reference else None, a.recipe_run)
        if not a.docs:
            print(block)
            return 0
        return refresh_block(a.docs, block, block_name(a.epochs), a.check)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
