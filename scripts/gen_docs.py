#!/usr/bin/env python
"""Write every generated block of README.md and docs/*.md, and the YAML cost lines, from their committed sources.

    python scripts/gen_docs.py            # rewrite every generated block and each YAML's "Cost <formula>." sentence
    python scripts/gen_docs.py --check    # exit 1, naming each file and block that differs; one line per source

Sources, one generator each:

* the registry: docs/backends.md's backend table, each YAML's cost sentence (:mod:`vitzoo.attention.catalog`) and
  docs/flops.md's "Every backend's formula" (:func:`vitzoo.flops.sweeps.formula_table`);
* ``results/docs/<table>.csv`` + ``.json``: docs/results.md's measured tables (:mod:`vitzoo.bench.results_tables`);
* the CIFAR-10 records: the ablation (``scripts/ablation.py``), the short-recipe and fast-recipe rankings
  (``scripts/compare.py``) and the convergence curve (``scripts/convergence.py``);
* the whole-model benchmark: README's backend guide (``scripts/backend_guide.py``).
* the ``--memory-only`` benchmark runs under ``results/benchmark/memory/``: docs/results.md's memory table
  (:mod:`vitzoo.bench.peak_table`).

A generator whose data is not committed yet is skipped with one line. ``--check`` also fails when a figure (a
number with a unit) of README's "Results at a glance" or of docs/results.md's text outside its generated blocks is
in no generated block, naming the file, line and figure.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable, Optional, Sequence

from vitzoo.attention import catalog, list_attention
from vitzoo.bench import peak_table, results_tables
from vitzoo.bench.docs_block import read_docs, with_block
from vitzoo.fileio import atomic_write_text, splice_block
from vitzoo.flops.sweeps import formula_table
from vitzoo.registry import ConfigError

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "backends.md"
FLOPS_DOC = ROOT / "docs" / "flops.md"
FLOPS_BEGIN = "<!-- generated:flops-formulas:begin (python scripts/gen_docs.py) -->"
FLOPS_END = "<!-- generated:flops-formulas:end -->"
RESULTS = "docs/results.md"  # relative to the checkout, as the generated blocks name their sources
README = "README.md"
SUMMARY = "Results at a glance"  # README's section whose figures must be in a generated block
PROSE_SKIP = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)  # fenced code and code spans: commands, not figures
RANKINGS = (("results/cifar10_short", "cifar10-short-ranking"), ("results/cifar10", "cifar10-ranking"))
LONG_RUN = "results/cifar10/50ep/vit_cifar/global/seed0.json"  # the convergence run (scripts/convergence.py)
TEN = "results/cifar10/10ep/vit_cifar/global"
TUNING, BASELINE = "results/cifar10_tuning", "results/cifar10_short/3ep/vit_cifar/global"  # scripts/ablation.py


def generated(doc: Path, conf_dir: Path, flops_doc: Path) -> dict[Path, tuple[str, str]]:
    """``{path: (block, text)}`` of every file this script writes.

    Args:
        doc: the backends page; conf_dir: the folder of ``<name>.yaml`` files; flops_doc: the FLOPs page.
    """
    table = formula_table(list_attention())
    text = splice_block(flops_doc.read_text(encoding="utf-8"), f"\n\n{table}\n", FLOPS_BEGIN, FLOPS_END, flops_doc)
    return {**catalog.generated_files(doc, conf_dir), flops_doc: ("block flops-formulas", text)}


def shown(path: Path) -> str:
    """``path`` relative to the checkout where it lies inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module (the scripts folder is no package)."""
    spec = importlib.util.spec_from_file_location(f"vitzoo_script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record_blocks() -> list[tuple[str, str, str, Optional[Callable[[], str]]]]:
    """``(doc, block, source, text)`` of each block made from records: ``text`` is None where the source is absent.

    Paths are relative to the checkout, the current folder while they are read (the blocks name them so).
    """
    blocks = []
    ablation, compare = script("ablation"), script("compare")
    blocks.append((RESULTS, ablation.BLOCK, TUNING, (lambda: ablation.table(Path(TUNING), Path(BASELINE)))
                   if Path(TUNING).is_dir() else None))
    for folder, block in RANKINGS:
        has = Path(folder).is_dir() and any(Path(folder).rglob("seed*.json"))
        blocks.append((RESULTS, block, folder, (lambda f=folder: compare.ranking_block(f, RESULTS)) if has else None))
    convergence = script("convergence")
    blocks.append((RESULTS, convergence.BLOCK, LONG_RUN, (lambda: convergence.docs_text(
        Path(LONG_RUN), Path(TEN), Path(RESULTS))) if Path(LONG_RUN).is_file() else None))
    blocks.append((RESULTS, peak_table.BLOCK, str(peak_table.FOLDER), (lambda: peak_table.block_text(
        Path("."), list_attention())) if peak_table.runs(Path(".")) else None))
    guide = script("backend_guide")
    bench = guide.BENCH / "models.csv"
    blocks.append((README, guide.BLOCK, str(bench), (lambda: guide.guide_text(root=Path.cwd()))
                   if bench.is_file() else None))
    return blocks


def refresh_records(check: bool) -> tuple[list[str], list[str]]:
    """Write (or compare) the blocks made from records under the current folder: ``(report lines, differences)``."""
    lines, changed = [], []
    for doc, block, source, text in record_blocks():
        if text is None:
            lines.append(f"skipped the {block} block of {doc}: no {source} committed")
            continue
        content = read_docs(doc)
        new = with_block(content, text(), block, doc)
        if new == content:
            lines.append(f"{doc}: the {block} block matches {source}")
        elif check:
            changed.append(f"{doc}: the {block} block differs from {source}")
        else:
            atomic_write_text(Path(doc), new)
            lines.append(f"wrote the {block} block of {doc} from {source}")
    return lines, changed


def prose_figures(doc: str, section: Optional[str] = None) -> list[str]:
    """Figures of ``doc``'s prose that no generated block of README or docs/results.md holds, one line each.

    A figure is what :data:`vitzoo.bench.results_tables.FIGURE` matches (a number or range with a unit); the prose
    is the text outside the generated blocks, code spans and fenced code; a figure may wrap onto the next line.

    Args:
        doc: the Markdown file, relative to the current folder; section: the ``## `` heading whose text alone is
            checked (README's results in brief), or None for the whole file.
    """
    text = read_docs(doc)
    generated = results_tables.generated_text(read_docs(README)) + results_tables.generated_text(read_docs(RESULTS))
    # blocks, fences and code spans blanked to their line breaks, so each position keeps its line number
    prose = PROSE_SKIP.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), results_tables.BLOCK.sub(
        lambda m: "\n" * m.group(0).count("\n"), text))
    start, end, where = 0, len(prose), "the text outside the generated blocks"
    if section is not None:
        marker = f"\n## {section}\n"
        if marker not in prose:
            raise ConfigError(f"{doc}: no '## {section}' section")
        start = prose.index(marker) + len(marker)
        end = prose.find("\n## ", start) if "\n## " in prose[start:] else len(prose)
        where = f"'{section}'"
    # every run of white space read as one space, so a figure may wrap; pieces[k] is the k-th character read
    pieces = list(re.finditer(r"\s+|\S", prose[start:end]))
    flat = "".join(" " if piece.group(0).isspace() else piece.group(0) for piece in pieces)
    problems = []
    for m in results_tables.FIGURE.finditer(flat):
        line = prose.count("\n", 0, start + pieces[m.start()].start()) + 1
        problems += [f"{doc}, line {line}: {where} quotes {figure}, which no generated block holds"
                     for figure in results_tables.unquoted_figures(m.group(0), generated)]
    return problems


@contextlib.contextmanager
def inside(folder: Path):
    """Run the enclosed code with ``folder`` as the current folder (``contextlib.chdir`` needs Python 3.11)."""
    here = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(here)


def results(root: Path, check: bool) -> tuple[list[str], list[str]]:
    """The measured tables, the record blocks and README's figures under ``root``: ``(report lines, differences)``."""
    if not (root / RESULTS).is_file():
        return [f"skipped the results blocks: no {RESULTS} under {root}"], []
    with inside(root):
        tables = results_tables.refresh_tables(Path("."), list_attention(), check)
        source = f"{results_tables.FOLDER}/*.csv"
        lines = ([f"{RESULTS}: the measured tables match {source}"] if not tables else
                 [] if check else [f"{RESULTS}: wrote {len(tables)} measured table(s) from {source}"])
        more, changed = refresh_records(check)
        summary, prose = prose_figures(README, SUMMARY), prose_figures(RESULTS)
    if not summary:
        lines.append(f"{README}: every figure of '{SUMMARY}' is in a generated block")
    if not prose:
        lines.append(f"{RESULTS}: every figure outside the generated blocks is in one")
    figures = summary + prose
    return lines + more, (tables if check else []) + changed + figures


def main(argv: Optional[Sequence[str]] = None, doc: Path = DOC,
         conf_dir: Path = catalog.CONFIG_DIR / "attention", flops_doc: Path = FLOPS_DOC, root: Path = ROOT) -> int:
    """Rewrite (or with ``--check`` compare) the generated text; returns the exit status.

    Args:
        argv: command-line arguments (default: ``sys.argv[1:]``).
        doc: the backends page to generate into.
        conf_dir: the folder of ``<name>.yaml`` files.
        flops_doc: the FLOPs page whose formula table is generated.
        root: the checkout whose results tables, record blocks and README are generated.
    """
    parser = argparse.ArgumentParser(prog="python scripts/gen_docs.py", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = catalog.differences(generated(doc, conf_dir, flops_doc))
        else:
            written = catalog.write_files(generated(doc, conf_dir, flops_doc))
        lines, changed = results(root, args.check)
    except ValueError as err:  # ConfigError included
        print(f"error: {err}", file=sys.stderr)
        return 1
    if not args.check:
        print(f"wrote {len(written)} file(s)" + "".join(f"\n  {shown(p)}" for p in written))
        print("\n".join(lines))
        for line in changed:
            print(line, file=sys.stderr)
        return 1 if changed else 0
    if not problems:
        print(f"generated text up to date: {shown(doc)}, {shown(flops_doc)} and {shown(conf_dir)}/*.yaml")
    print("\n".join(lines))
    for problem in problems + changed:
        print(problem.replace(str(ROOT) + "/", ""), file=sys.stderr)
    if problems or changed:
        print(f"{len(problems) + len(changed)} generated file(s) differ: run python scripts/gen_docs.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
