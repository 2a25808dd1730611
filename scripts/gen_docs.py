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
* the ``--memory-only`` benchmark runs under ``results/benchmark/memory/``: docs/results.md's memory table, and
  under ``results/benchmark/sparse_memory/`` its sparse patterns against ``global`` (:mod:`vitzoo.bench.peak_table`).

A generator whose data is not committed yet is skipped with one line. ``--check`` also fails when a figure (a
number with a unit) of README's "Results at a glance" or of docs/results.md's text outside its generated blocks is
in none of the generated blocks of its own section or of a section its paragraph links (``[..](#anchor)``), or
follows a backend's code span (```mixer` 62.21 %``) but is not in that backend's row, naming the file, line and
figure (:func:`prose_figures`).
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
HEADING = re.compile(r"^(#{2,6}) ", re.MULTILINE)  # a section's heading (the page title's "# " holds no figures)
LINK = re.compile(r"\]\(([^()#\s]*)#([\w-]+)\)")  # a Markdown link to a heading's anchor: (file or "", anchor)
LABEL = re.compile(r"`([^`\n]+)`(?:'s)?\s*$")  # a code span right before a figure: the row it must be read from
PARAGRAPH_START = re.compile(r"#+ |[ \t]*(?:[-*+]|\d+\.) ")  # a heading or a list item starts a paragraph
RANKINGS = (("results/cifar10_short", "cifar10-short-ranking"), ("results/cifar10", "cifar10-ranking"))
NO_RECORDS = "No record under `{folder}` yet: `bash scripts/sweep_cifar10.sh {folder}` writes them."  # empty ranking
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
    reference = Path(ablation.LONG_REFERENCE)  # the shipped recipe's own 10-epoch record, once the sweep has it
    long_runs = Path(TUNING).is_dir() and any(ablation.epochs_of(ablation.read(p)) == ablation.LONG_EPOCHS
                                              for p in Path(TUNING).glob("*/vit_cifar/global/seed*.json"))
    blocks.append((RESULTS, ablation.block_name(ablation.LONG_EPOCHS), TUNING, (lambda: ablation.table(
        Path(TUNING), Path(ablation.LONG_BASELINE), ablation.LONG_EPOCHS,
        reference if (reference / "seed0.json").is_file() else None, ablation.RECIPE_RUN)) if long_runs else None))
    for folder, block in RANKINGS:
        has = Path(folder).is_dir() and any(Path(folder).rglob("seed*.json"))
        empty = (lambda f=folder: NO_RECORDS.format(folder=f)) if Path(folder).is_dir() else None
        blocks.append((RESULTS, block, folder, (lambda f=folder: compare.ranking_block(f, RESULTS)) if has else empty))
    convergence = script("convergence")
    blocks.append((RESULTS, convergence.BLOCK, LONG_RUN, (lambda: convergence.docs_text(
        Path(LONG_RUN), Path(TEN), Path(RESULTS))) if Path(LONG_RUN).is_file() else None))
    blocks.append((RESULTS, peak_table.BLOCK, str(peak_table.FOLDER), (lambda: peak_table.block_text(
        Path("."), list_attention())) if peak_table.runs(Path(".")) else None))
    sparse = any((Path(".") / peak_table.SPARSE_FOLDER).glob("**/models.csv"))
    blocks.append((RESULTS, peak_table.SPARSE_BLOCK, str(peak_table.SPARSE_FOLDER), (lambda: peak_table.sparse_text(
        Path("."))) if sparse else None))
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


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


class Page:
    """A Markdown file read for the figure check: its prose, its sections and its generated blocks.

    ``prose`` is the text with generated blocks, fenced code and code spans blanked character by character, so a
    position in it is the same position in ``text``. A section runs from its heading (``##`` or deeper) to the next
    heading of the same or a higher level, its subsections included.

    Args:
        doc: the Markdown file, relative to the current folder.
    """

    def __init__(self, doc: str):
        self.doc, self.text = doc, read_docs(doc)
        blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
        self.prose = PROSE_SKIP.sub(blank, results_tables.BLOCK.sub(blank, self.text))
        self.blocks = [(m.start(), m.group(2)) for m in results_tables.BLOCK.finditer(self.text)]
        heads = [(len(m.group(1)), m.start(), self.text[m.end():self.text.find("\n", m.end())].strip())
                 for m in HEADING.finditer(self.prose)]
        self.sections, seen = [], {}  # (anchor, title, start, end), in the order of the file
        for i, (level, start, title) in enumerate(heads):
            end = next((s for lv, s, _ in heads[i + 1:] if lv <= level), len(self.text))
            slug = anchor(title)
            seen[slug] = seen.get(slug, -1) + 1
            self.sections.append((slug if not seen[slug] else f"{slug}-{seen[slug]}", title, start, end))

    def section_at(self, position: int) -> Optional[tuple[str, str, int, int]]:
        """The innermost section holding ``position``, or None before the first heading."""
        return next((s for s in reversed(self.sections) if s[2] <= position), None)

    def held(self, section: tuple[str, str, int, int]) -> list[str]:
        """The text of each generated block inside ``section``."""
        return [text for start, text in self.blocks if section[2] <= start < section[3]]


def paragraphs(text: str, prose: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each paragraph: runs of lines split at blank lines, headings and list items.

    Args:
        text: the Markdown text; prose: the same text with code blanked (:class:`Page`), which says what is blank.
    """
    spans, start, pos = [], None, 0
    for line in prose.splitlines(keepends=True):
        if start is not None and (not line.strip() or PARAGRAPH_START.match(text, pos)):
            spans.append((start, pos))
            start = None
        if line.strip() and start is None:
            start = pos
        pos += len(line)
    return spans + ([(start, pos)] if start is not None else [])


def linked_blocks(page: Page, first: int, last: int, pages: dict[str, Page]) -> tuple[list[str], list[str], list]:
    """``(blocks, names, broken)`` of the sections a paragraph links: their blocks' text, ``file#anchor`` of each,
    and ``(position, file#anchor)`` of each link into a Markdown file that has no such heading.

    Args:
        page: the page holding the paragraph; first, last: the paragraph's span in it; pages: the pages read so
            far, by path.
    """
    blocks, names, broken = [], [], []
    for link in LINK.finditer(page.prose, first, last):
        target, slug = link.groups()
        path = os.path.normpath(os.path.join(os.path.dirname(page.doc), target)) if target else page.doc
        if not path.endswith(".md") or not Path(path).is_file():
            continue  # a link out of the checkout's Markdown holds no block
        if path not in pages:
            pages[path] = page if path == page.doc else Page(path)
        hits = [s for s in pages[path].sections if s[0] == slug]
        name = f"{'' if path == page.doc else path}#{slug}"
        blocks += pages[path].held(hits[0]) if hits else []
        names += [name] if hits else []
        broken += [] if hits else [(link.start(), name)]
    return blocks, names, broken


def row_text(blocks: list[str], label: Optional[str]) -> str:
    """What a figure may be read from: every block whole, or with ``label`` the rows (lines) naming it of each block
    that names it, and the whole of each block that does not."""
    if label is None:
        return "\n".join(blocks)
    named = re.compile(rf"(?<![\w-]){re.escape(label)}(?![\w-])")
    rows = [[row for row in block.splitlines() if named.search(row)] for block in blocks]
    return "\n".join("\n".join(mine) if mine else block for mine, block in zip(rows, blocks))


def prose_figures(doc: str, section: Optional[str] = None) -> list[str]:
    """Figures of ``doc``'s prose that the generated blocks they belong to do not hold, one line each.

    A figure is what :data:`vitzoo.bench.results_tables.FIGURE` matches (a number or range with a unit); the prose
    is the text outside the generated blocks, code spans and fenced code; a figure may wrap onto the next line.
    A figure belongs to the blocks of the innermost section holding its paragraph (a ``##`` or deeper heading's
    section, its subsections included) and to those of every section the paragraph links (``[..](#anchor)``,
    ``[..](other.md#anchor)``): a value copied from another section's table fails. A figure right after a code
    span (```mixer` 62.21 %``, ```global`'s 55.67 %``) is read, in a block with rows naming that span, from those
    rows only. A link to a heading that its file lacks is a problem too.

    Args:
        doc: the Markdown file, relative to the current folder; section: the ``## `` heading whose text alone is
            checked (README's results in brief), or None for the whole file.
    """
    page, pages = Page(doc), {}
    start, end, where = 0, len(page.text), "the text outside the generated blocks"
    if section is not None:
        found = [s for s in page.sections if s[1] == section and page.text.startswith("## ", s[2])]
        if not found:
            raise ConfigError(f"{doc}: no '## {section}' section")
        start, end, where = found[0][2], found[0][3], f"'{section}'"
    problems = []
    for first, last in paragraphs(page.text[:end], page.prose[:end]):
        if first < start:
            continue
        home = page.section_at(first)
        blocks, names, broken = linked_blocks(page, first, last, pages)
        blocks, names = (page.held(home) + blocks, [f"'{home[1]}'"] + names) if home else (blocks, names)
        problems += [f"{doc}, line {page.text.count(chr(10), 0, at) + 1}: {where} links {name}, which names no "
                     "heading" for at, name in broken]
        read = f"blocks of {', '.join(names)}" if names else "no section and no link"
        # every run of white space read as one space, so a figure may wrap; pieces[k] is the k-th character read
        pieces = list(re.finditer(r"\s+|\S", page.prose[first:last]))
        flat = "".join(" " if piece.group(0).isspace() else piece.group(0) for piece in pieces)
        for m in results_tables.FIGURE.finditer(flat):
            at = first + pieces[m.start()].start()
            label = LABEL.search(page.text[first:at])
            row = f" in its `{label.group(1)}` row" if label else ""
            held = row_text(blocks, label.group(1) if label else None)
            problems += [f"{doc}, line {page.text.count(chr(10), 0, at) + 1}: {where} quotes {figure}, which no "
                         f"generated block holds{row} ({read})"
                         for figure in results_tables.unquoted_figures(m.group(0), held)]
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
