#!/usr/bin/env python
"""README's "Choosing a backend" block from whole-model measurements: each backend's training speed and peak
memory against ``global`` at each measured token count, and the token counts at which it pays off.

    python scripts/benchmark.py --mode models --models vit_cifar --img-size 128,256 --batch 4,1 --batch-per-size \\
        --amp bf16 --no-references --out results/benchmark/whole_model     # on a quiet machine
    python scripts/backend_guide.py            # rewrite the backend-guide block of README.md
    python scripts/backend_guide.py --check    # exit 1 if the block differs from what the CSVs give
    python scripts/backend_guide.py --print    # print the block, write nothing

Every registered backend gets a row (one without a measurement says so); the family and cost formula come from
the registry (:mod:`vitzoo.attention.catalog`), the CIFAR-10 column from the short recipe's ranking
(``scripts/compare.py``'s ``ranking.csv``).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Union

from vitzoo.attention import FAMILY_PACKAGES, list_attention
from vitzoo.attention.catalog import backend_entry
from vitzoo.bench.docs_block import refresh_block
from vitzoo.fileio import read_regular_text
from vitzoo.models import model_config
from vitzoo.registry import ConfigError

ROOT = Path(__file__).resolve().parents[1]
BLOCK = "backend-guide"  # README's markers: <!-- backend-guide:begin --> ... <!-- backend-guide:end -->
BENCH = Path("results/benchmark/whole_model")  # the benchmark's --out folder (relative to the checkout)
RANKING = Path("results/cifar10_short/ranking.csv")  # the 3-epoch CIFAR-10 ranking (scripts/compare.py)
EPOCHS = 3  # the CIFAR-10 column's training budget (rows of other budgets in the ranking are left out)
LONG_RANKING = Path("results/cifar10/ranking.csv")  # the fast recipe's 10-epoch ranking, once it has records
LONG_EPOCHS = 10  # its training budget
FASTER = 1.05  # "faster than global": at least 5 % more training images/s (less is within run-to-run drift)
UNKNOWN = "not measured"
WIDTH = 115  # the prose's line length (README wraps its paragraphs; the table rows and provenance line stay whole)

Outcome = Union[float, str]  # a ratio to global, or why there is none ("out of memory", "not measured", ...)


def tokens_text(n: int) -> str:
    """``4096`` -> ``"4,096"``."""
    return f"{n:,}"


def read_bench(folder: Path) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """The rows of ``<folder>/models.csv`` and ``<folder>/environment.json``, or a one-line error naming --bench.

    Args:
        folder: the benchmark's ``--out`` folder.
    """
    try:
        rows = list(csv.DictReader(read_regular_text(folder / "models.csv").splitlines()))
        env = json.loads(read_regular_text(folder / "environment.json"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"--bench {folder}: no readable models.csv and environment.json ({type(e).__name__}); "
                          f"run scripts/benchmark.py --mode models --out {folder} first") from None
    missing = {"backend", "model", "img_size", "batch", "status", "train_img_s", "train_peak_mb"} - set(
        rows[0] if rows else ())
    if missing:
        raise ConfigError(f"--bench {folder}: models.csv lacks the column(s) {', '.join(sorted(missing))}")
    return rows, env


def pick_model(rows: Sequence[Mapping[str, str]], model: Optional[str]) -> str:
    """The model whose rows the table shows: ``model``, or the only one in ``rows``.

    Args:
        rows: models.csv rows; model: the ``--model`` option (``None``: the only model measured).
    """
    models = sorted({r["model"] for r in rows})
    if model is None and len(models) == 1:
        return models[0]
    if model is None or model not in models:
        raise ConfigError(f"--model {model}: pick one of the measured models {', '.join(models) or '(none)'}")
    return model


def by_size(rows: Sequence[Mapping[str, str]], model: str) -> dict[int, dict[str, Mapping[str, str]]]:
    """``{img_size: {backend: row}}`` of ``model``; two rows of one backend at one size are an error.

    Args:
        rows: models.csv rows; model: the model to keep.
    """
    table: dict[int, dict[str, Mapping[str, str]]] = {}
    for r in rows:
        if r["model"] != model:
            continue
        size = table.setdefault(int(r["img_size"]), {})
        if r["backend"] in size:
            raise ConfigError(f"--bench: two rows of {r['backend']} at {r['img_size']} px (batches "
                              f"{size[r['backend']]['batch']} and {r['batch']}); keep one batch per size")
        size[r["backend"]] = r
    for img, size in table.items():
        if size.get("global", {}).get("status") != "ok":
            raise ConfigError(f"--bench: no ok global row at {img} px, the reference of every ratio there")
    return table


def ratio(row: Optional[Mapping[str, str]], base: Mapping[str, str], key: str) -> Outcome:
    """``row[key]`` over ``base[key]`` (above 1: more images/s, or more memory, than ``global``), or why there is
    no ratio: the row's status up to its details (``out of memory``, ``timed out``), or :data:`UNKNOWN`.

    Args:
        row: the backend's row (``None``: not measured); base: global's row; key: the CSV column.
    """
    if row is None:
        return UNKNOWN
    if row["status"] != "ok":
        return row["status"].split(" during")[0].split(":")[0]
    return float(row[key]) / float(base[key])


def known(outcome: Outcome) -> bool:
    """Whether ``outcome`` says something about speed: a ratio, or a run stopped for memory or time."""
    return isinstance(outcome, float) or outcome.startswith(("out of memory", "timed out", "killed"))


def pays_off(speeds: Sequence[Outcome], tokens: Sequence[int]) -> str:
    """At which of ``tokens`` a backend trains faster than ``global`` (at least :data:`FASTER` times its images/s).

    Args:
        speeds: the backend's speed over global's at each token count (ascending), or why there is none.
        tokens: the token counts.
    """
    unknown = [tokens_text(n) for n, s in zip(tokens, speeds) if not known(s)]
    if unknown:
        return f"{UNKNOWN} at {', '.join(unknown)} tokens"
    faster = [isinstance(s, float) and s >= FASTER for s in speeds]
    last = tokens_text(tokens[-1])
    if not any(faster):
        return f"not up to {last} tokens"
    start = faster.index(True)
    if all(faster[start:]):
        return f"from {tokens_text(tokens[start])} tokens"
    end = len(faster) - 1 - faster[::-1].index(True)
    if all(faster[:end + 1]):
        return f"up to {tokens_text(tokens[end])} tokens, not at {last}"
    return "at " + ", ".join(tokens_text(n) for n, f in zip(tokens, faster) if f) + " tokens"


def wrap(text: str) -> str:
    """A paragraph in lines of at most :data:`WIDTH` characters, never breaking a word, link or code span's word."""
    return textwrap.fill(text, WIDTH, break_long_words=False, break_on_hyphens=False)


def times(outcome: Outcome) -> str:
    """A table cell: ``1.16×``, or the reason there is no ratio."""
    return f"{outcome:.2f}×" if isinstance(outcome, float) else outcome


def cifar10(path: Optional[Path], model: str, epochs: int = EPOCHS) -> dict[str, str]:
    """``{backend: "55.67 %"}``: the ranking's top-1 of ``model`` after ``epochs`` epochs, and under the key
    ``"experiment"`` the recipe the rows name (``path`` ``None``: empty, no CIFAR-10 column).

    Args:
        path: ``ranking.csv`` of ``scripts/compare.py``; model: the model whose rows count; epochs: their budget.
    """
    if path is None:
        return {}
    try:
        rows = list(csv.DictReader(read_regular_text(path).splitlines()))
    except (OSError, ValueError) as e:
        raise ConfigError(f"--ranking {path}: not readable ({type(e).__name__})") from None
    rows = [r for r in rows if r.get("model") == model and r.get("epochs") == str(epochs) and r.get("top1")]
    names = [r["attention"] for r in rows]
    if len(set(names)) != len(names):
        raise ConfigError(f"--ranking {path}: two {epochs}-epoch rows of one backend; a folder holds one recipe")
    cells = {r["attention"]: f"{float(r['top1']):.2f} %" for r in rows}
    if cells:
        cells["experiment"] = ", ".join(sorted({f"`experiment={r.get('experiment')}`" for r in rows}))
    return cells


def order() -> list[str]:
    """Registered backends, family by family (dense first), by name within a family."""
    names = list_attention()
    return sorted(names, key=lambda n: (FAMILY_PACKAGES.index(backend_entry(n).family), n))


def provenance(env: Mapping[str, Any], rankings: Sequence[str]) -> str:
    """The block's machine, command, commit and date line.

    Args:
        env: the run's ``environment.json`` (its ``command`` names the benchmark's folder);
        rankings: the CIFAR-10 columns' sources as the options named them (none: no such column).
    """
    machine = env.get("gpu") if env.get("device") == "cuda" else f"{env.get('cpu_model')}, {env.get('cpu_count')} cores"
    named = " and ".join(f"`{r}`" for r in rankings)
    table = "`python scripts/backend_guide.py`" + (
        f" (CIFAR-10 column{'s' if len(rankings) > 1 else ''}: {named})" if rankings else "")
    return (f"> **Machine:** {machine}, torch {env.get('torch')} · **Command:** "
            f"`{env.get('command', 'not recorded')}`; table: {table} · **Commit:** `{env.get('git_commit')}` · "
            f"**Date:** {str(env.get('date', 'not recorded'))[:10]}")


def block(rows: Sequence[Mapping[str, str]], env: Mapping[str, Any], model: Optional[str] = None,
          accuracy: Optional[Mapping[str, str]] = None, ranking: Optional[Path] = RANKING,
          long_accuracy: Optional[Mapping[str, str]] = None, long_ranking: Optional[Path] = LONG_RANKING) -> str:
    """The Markdown of the backend-guide block (no trailing newline).

    Args:
        rows: models.csv rows; env: the run's environment.json; model: the model to show (default: the only one);
        accuracy: :func:`cifar10`'s cells of the 3-epoch ranking (empty or ``None``: no such column);
        ranking: that column's source as the provenance line names it;
        long_accuracy, long_ranking: the same for the fast recipe's 10-epoch ranking (its column comes first).
    """
    model = pick_model(rows, model)
    table = by_size(rows, model)
    sizes = sorted(table)
    patch = model_config(model).patch_size
    tokens = [(img // patch) ** 2 for img in sizes]  # grid tokens, the class token left out
    toks = [tokens_text(n) for n in tokens]
    base = {img: table[img]["global"] for img in sizes}
    accuracy, long_accuracy = accuracy or {}, long_accuracy or {}
    columns = [(f"CIFAR-10 top-1 ({n} epochs)", cells) for n, cells in ((LONG_EPOCHS, long_accuracy),
                                                                        (EPOCHS, accuracy)) if cells]
    head = (["backend", "family", "cost (multiply-adds, one image)"]
            + [f"speed × global, {t} tokens" for t in toks] + [f"memory × global, {t} tokens" for t in toks]
            + ["pays off"] + [label for label, _ in columns])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    faster: dict[int, list[tuple[float, str]]] = {n: [] for n in tokens}
    for name in order():
        entry = backend_entry(name)
        speeds = [ratio(table[img].get(name), base[img], "train_img_s") for img in sizes]
        memory = [ratio(table[img].get(name), base[img], "train_peak_mb") for img in sizes]
        verdict = "the baseline" if name == "global" else pays_off(speeds, tokens)
        if "fixed_length" in entry.flags:
            verdict += "; one fixed token grid"
        for n, s in zip(tokens, speeds):
            if name != "global" and isinstance(s, float) and s >= FASTER:
                faster[n].append((s, name))
        cells = [f"`{name}`", entry.family.replace("_", " "), f"`{entry.formula}`",
                 *map(times, speeds), *map(times, memory), verdict]
        lines.append("| " + " | ".join(cells + [c.get(name, "pending") for _, c in columns]) + " |")
    extra = sorted({r["backend"] for size in table.values() for r in size.values()} - set(list_attention()))
    g = [base[img] for img in sizes]
    options = env.get("options", {})
    amp = "bf16 autocast" if options.get("amp") == "bf16" else "fp32"
    processes = "one process per configuration" if options.get("isolate", True) else "all in one process"
    intro = (
        f"`{model}` trained whole (forward, cross-entropy, backward, AdamW step) at {' and '.join(toks)} grid tokens "
        f"({' and '.join(f'{img} px' for img in sizes)}, batch {' and '.join(r['batch'] for r in g)}), {amp}, "
        f"{processes}. Speed: training images/s over `global`'s in the same run; memory: peak "
        f"training memory over `global`'s (`global`: "
        + ", ".join(f"{float(r['train_img_s']):.3g} images/s and {float(r['train_peak_mb']):,.0f} MB at {t} tokens"
                    for r, t in zip(g, toks))
        + f"). **pays off**: the token counts at which the backend trains at least {FASTER:.2f}× as fast as "
        "`global`. Symbols: N tokens, C channels, h heads, d = C/h; the rest are defined in "
        "[docs/backends.md](docs/backends.md#attention-backends), which also lists every backend's options; one "
        "attention layer alone is in [docs/results.md](docs/results.md#one-attention-layer-versus-tokens).")
    if long_accuracy:
        intro += (f" CIFAR-10 top-1 at {LONG_EPOCHS} epochs: `{model}`, {long_accuracy['experiment']} (the fast "
                  "recipe), one seed or the mean of two, \"pending\" until the sweep has the backend's record; the "
                  "[ranking](docs/results.md#the-fast-recipe-every-backend-at-10-epochs) has the intervals.")
    if accuracy:
        intro += (f" CIFAR-10 top-1: `{model}`, {EPOCHS} epochs of {accuracy['experiment']} (early learning), one "
                  "seed or the mean of two; the [ranking](docs/results.md#the-short-recipe-every-backend-at-3-epochs-"
                  "early-learning) has the intervals.")
    summary = []
    for n, t in zip(tokens, toks):
        best = sorted(faster[n], reverse=True)
        names = ", ".join(f"`{b}` {s:.2f}×" for s, b in best) or "none"
        verb = "backend pays" if len(best) == 1 else "backends pay"
        summary.append(f"at {t} tokens {len(best)} {verb} off ({names})")
    sources = [str(r) for r, cells in ((long_ranking, long_accuracy), (ranking, accuracy)) if cells and r]
    out = [provenance(env, sources), "", wrap(intro), "", *lines, "",
           wrap("In short: " + "; ".join(summary) + ".")]
    if extra:
        out += ["", f"Rows of unregistered backends left out: {', '.join(f'`{e}`' for e in extra)}."]
    return "\n".join(out)


def guide_text(bench: Path = BENCH, ranking: Optional[Path] = RANKING, model: Optional[str] = None,
               root: Path = ROOT, long_ranking: Optional[Path] = LONG_RANKING) -> str:
    """The block from the benchmark folder ``bench`` and the ranking CSVs (relative paths under ``root``).

    Args:
        bench: the whole-model benchmark folder; ranking: the 3-epoch CIFAR-10 ranking.csv (None: no such column);
        model: the model whose rows to show (default: the only one measured); root: the checkout;
        long_ranking: the fast recipe's 10-epoch ranking.csv (None, or not written yet: no such column).
    """
    def under(path: Optional[Path]) -> Optional[Path]:
        return path if path is None or path.is_absolute() else root / path

    rows, env = read_bench(under(bench))
    model = pick_model(rows, model)
    accuracy = cifar10(under(ranking), model)
    long = under(long_ranking)
    long_accuracy = cifar10(long, model, LONG_EPOCHS) if long is not None and long.is_file() else {}
    return block(rows, env, model, accuracy, ranking, long_accuracy, long_ranking)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Rewrite (``--check``: compare, ``--print``: print) the block; returns the exit status.

    Args:
        argv: command-line arguments (default: ``sys.argv[1:]``).
    """
    p = argparse.ArgumentParser(prog="python scripts/backend_guide.py", description=__doc__.splitlines()[0])
    p.add_argument("--bench", default=str(BENCH),
                   help="the whole-model benchmark folder (models.csv and environment.json)")
    p.add_argument("--ranking", default=str(RANKING),
                   help="CIFAR-10 ranking.csv for the 3-epoch top-1 column ('' for none)")
    p.add_argument("--long-ranking", default=str(LONG_RANKING),
                   help="the fast recipe's 10-epoch ranking.csv for its top-1 column ('' for none; absent: none)")
    p.add_argument("--model", default=None, help="the model whose rows to show (default: the only one measured)")
    p.add_argument("--docs", default=str(ROOT / "README.md"), help="the Markdown file holding the block")
    p.add_argument("--check", action="store_true", help="compare only; exit 1 if the block differs")
    p.add_argument("--print", dest="show", action="store_true", help="print the block, write nothing")
    a = p.parse_args(argv)
    try:
        text = guide_text(Path(a.bench), Path(a.ranking) if a.ranking else None, a.model,
                          long_ranking=Path(a.long_ranking) if a.long_ranking else None)
        if a.show:
            print(text)
            return 0
        return refresh_block(a.docs, text, BLOCK, a.check)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
