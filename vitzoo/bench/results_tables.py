"""The measured tables of docs/results.md, generated from committed data.

Each table is two files under ``results/docs/``: ``<name>.csv`` (its rows, as measured) and ``<name>.json`` (where
and how: ``machine``, ``command``, ``commit``, ``date``, and ``doc``, the Markdown file holding the table). The
table goes between ``<!-- results:<name>:begin -->`` and ``<!-- results:<name>:end -->`` of that file: the source
line (machine, command, commit, date), the table, and, where the rows name fewer backends than the registry holds,
one line naming the backends left out and why.

Optional sidecar keys:

* ``view``: ``models`` or ``layers`` when the CSV is ``scripts/benchmark.py``'s own ``models.csv`` (``--mode
  models``) or ``layers.csv`` (``--mode layers``): the columns of :data:`VIEWS` are shown, a value with its
  ``_min``/``_max`` columns as ``value (min–max)``. A re-measurement replaces the CSV with the benchmark's file.
  Without ``view`` the CSV's header is the table's header and each cell is shown as written.
* ``backend_column``: the column naming the backend (default ``backend`` or ``attention``, where present).
* ``left_out``: why the backends missing from the rows are left out (default: registered after the measurement).
* ``right``: columns aligned to the right.
"""
from __future__ import annotations

import csv
import io
import json
import re
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from vitzoo.bench.docs_block import read_docs, with_block
from vitzoo.bench.report import fmt
from vitzoo.fileio import atomic_write_text, read_regular_text
from vitzoo.registry import ConfigError

FOLDER = Path("results/docs")  # the tables' data, relative to the checkout
PREFIX = "results:"  # block names: results:<table>
REQUIRED = ("machine", "command", "commit", "date", "doc")  # sidecar keys every table needs
OPTIONAL = ("view", "backend_column", "left_out", "right")
LEFT_OUT = "registered after this measurement; re-run the command above to add them"
WIDTH = 115  # the line length of generated prose (docs/results.md wraps its paragraphs)
RANGE = "~"  # a view column key ending in it shows ``key (key_min–key_max)``
# header -> CSV column of the benchmark's own files (scripts/benchmark.py --mode models / --mode layers)
VIEWS: dict[str, list[tuple[str, str]]] = {
    "models": [("backend", "backend"), ("model", "model"), ("img", "img_size"), ("batch", "batch"),
               ("status", "status"), ("train img/s (min–max)", "train_img_s~"), ("train MFU", "train_mfu"),
               ("infer img/s (min–max)", "infer_img_s~"), ("infer MFU", "infer_mfu"),
               ("batch-1 ms (min–max)", "latency_ms~"), ("train peak MB", "train_peak_mb"),
               ("infer peak MB", "infer_peak_mb"), ("params M", "params_m"), ("GMACs (fvcore)", "gmacs"),
               ("GMACs (analytic)", "gmacs_analytic")],
    "layers": [("backend", "backend"), ("tokens", "tokens"), ("status", "status"),
               ("fwd+bwd ms (min–max)", "ms~"), ("peak MB", "peak_mb"), ("GMACs/img (analytic)", "gmacs_analytic"),
               ("FLOPs ratio global/backend", "flops_ratio"),
               ("time ratio global/backend (paired min–max)", "time_ratio~"),
               ("time ratio / FLOPs ratio", "efficiency"), ("time ratio from", "ratio_method"), ("MFU", "mfu")],
}


def value(cell: str) -> Any:
    """A CSV cell as the benchmark wrote it: None when empty, else an int, a float or the text."""
    if cell == "":
        return None
    if re.fullmatch(r"-?\d+", cell):
        return int(cell)
    try:
        return float(cell)
    except ValueError:
        return cell


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The header and rows of ``path`` (a regular file), else one line naming it."""
    try:
        text = read_regular_text(path)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not readable ({getattr(e, 'strerror', None) or type(e).__name__})") from None
    reader = csv.DictReader(io.StringIO(text))
    rows = list(reader)
    if not reader.fieldnames:
        raise ConfigError(f"{path}: no header row")
    return list(reader.fieldnames), rows


def read_sidecar(path: Path) -> dict[str, Any]:
    """The table's ``<name>.json``: its :data:`REQUIRED` keys as text, else one line naming the file and key."""
    try:
        meta = json.loads(read_regular_text(path))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{path}: not a readable JSON file ({type(e).__name__})") from None
    if not isinstance(meta, dict):
        raise ConfigError(f"{path}: must hold one JSON object")
    for key in REQUIRED:
        if not isinstance(meta.get(key), str) or not meta[key]:
            raise ConfigError(f"{path}: '{key}' must be a non-empty string")
    unknown = sorted(set(meta) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(unknown)}; use {', '.join(REQUIRED + OPTIONAL)}")
    if meta.get("view") is not None and meta["view"] not in VIEWS:
        raise ConfigError(f"{path}: view={meta['view']!r}; use one of {', '.join(VIEWS)}")
    return meta


def shown_cells(header: Sequence[str], rows: Sequence[Mapping[str, str]], view: Optional[str],
                where: Any) -> tuple[list[str], list[list[str]]]:
    """The table's header and cells: the CSV as written, or the benchmark columns of ``view``.

    Args:
        header: the CSV's columns; rows: its rows; view: a key of :data:`VIEWS` or None; where: the CSV (errors).
    """
    if view is None:
        return list(header), [[r.get(c) or "" for c in header] for r in rows]
    spec = VIEWS[view]
    missing = [key.rstrip(RANGE) for _, key in spec if key.rstrip(RANGE) not in header]
    if missing:
        raise ConfigError(f"{where}: view={view} needs the column(s) {', '.join(missing)}")
    cells = []
    for r in rows:
        line = []
        for _, key in spec:
            name = key.rstrip(RANGE)
            text = fmt(value(r.get(name) or ""))
            lo, hi = value(r.get(f"{name}_min") or ""), value(r.get(f"{name}_max") or "")
            if key.endswith(RANGE) and text and lo is not None and hi is not None:
                text = f"{text} ({fmt(lo)}–{fmt(hi)})"
            line.append(text)
        cells.append(line)
    return [h for h, _ in spec], cells


def markdown(header: Sequence[str], cells: Sequence[Sequence[str]], right: Sequence[str] = ()) -> str:
    """A Markdown table; the columns named in ``right`` aligned to the right."""
    def row(items: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in items) + " |"
    rule = "|" + "|".join("---:" if h in right else "---" for h in header) + "|"
    return "\n".join([row(header), rule, *(row(c) for c in cells)])


def source_line(meta: Mapping[str, str]) -> str:
    """The table's provenance: ``> **Machine:** ... · **Command:** ... · **Commit:** ... · **Date:** ...``."""
    return (f"> **Machine:** {meta['machine']} · **Command:** {meta['command']} · **Commit:** {meta['commit']} "
            f"· **Date:** {meta['date']}")


def backend_column(header: Sequence[str], meta: Mapping[str, Any]) -> Optional[str]:
    """The header naming each row's backend: the sidecar's ``backend_column``, else ``backend`` or ``attention``."""
    if meta.get("backend_column"):
        return meta["backend_column"]
    return next((c for c in ("backend", "attention") if c in header), None)


def coverage(header: Sequence[str], cells: Sequence[Sequence[str]], meta: Mapping[str, Any],
             registered: Sequence[str]) -> Optional[str]:
    """One line naming the registered backends the rows leave out, and why; None when none is left out.

    Args:
        header: the shown header; cells: the shown rows; meta: the sidecar; registered: every backend's name.
    """
    column = backend_column(header, meta)
    if column is None:
        return None
    if column not in header:
        raise ConfigError(f"backend_column={column!r} is not a column of the table ({', '.join(header)})")
    i = list(header).index(column)
    shown = {c[i].strip("`") for c in cells}
    missing = [name for name in registered if name not in shown]
    if not missing:
        return None
    return (f"Not covered ({len(missing)} of {len(registered)} registered backends): "
            f"{', '.join(f'`{m}`' for m in missing)} ({meta.get('left_out') or LEFT_OUT}).")


def tokens_text(n: int) -> str:
    """A token count as the docs write it: ``1,024``."""
    return f"{n:,}"


def layer_summary(rows: Sequence[Mapping[str, str]], fast: float = 10.0) -> str:
    """Where one layer pays off, from the layer benchmark's rows: for each backend the smallest token count from
    which its time ratio over ``global`` stays above 1 at every larger count measured (a failed size does not pay
    off), and the backends at least ``fast`` times faster at the largest count that every one of them ran.

    Args:
        rows: ``layers.csv`` rows (``backend``, ``tokens``, ``status``, ``time_ratio``); fast: the speed-up listed.
    """
    ratios: dict[str, dict[int, Optional[float]]] = {}
    for r in rows:
        ratio = value(r.get("time_ratio") or "") if r.get("status") == "ok" else None
        ratios.setdefault(r["backend"], {})[int(r["tokens"])] = ratio if isinstance(ratio, float) else None
    sizes = sorted({n for by in ratios.values() for n in by})
    start: dict[int, list[str]] = {n: [] for n in sizes}
    others = []
    for name, by in sorted(ratios.items()):
        if name == "global":
            continue
        pays = [n for n in sizes if all((by.get(m) or 0) > 1 for m in sizes if m >= n)]
        if pays:
            start[pays[0]].append(name)
            continue
        good = [n for n in sizes if (by.get(n) or 0) > 1]
        last = [n for n in sizes if by.get(n) is not None]
        if good:
            after = next(n for n in sizes if n > good[-1])
            tail = f" ({fmt(by[after])}× at {tokens_text(after)})" if by.get(after) is not None else ""
            others.append(f"`{name}` at {' and '.join(map(tokens_text, good))} tokens only{tail}")
        else:
            others.append(f"`{name}` at no size" + (f" ({fmt(by[last[-1]])}× at {tokens_text(last[-1])})"
                                                   if last else ""))
    parts = [f"from {tokens_text(n)} tokens " + ", ".join(f"`{b}`" for b in names[:-1])
             + (" and " if len(names) > 1 else "") + f"`{names[-1]}`" for n, names in start.items() if names]
    text = ("Where one layer pays off (time ratio above 1 at that token count and at every larger one measured): "
            + "; ".join(parts + others) + ".")
    top = next((n for n in reversed(sizes) if all(by.get(n) is not None for by in ratios.values())), None)
    if top is not None:
        quick = sorted(((by[top], b) for b, by in ratios.items() if b != "global" and (by.get(top) or 0) >= fast),
                       reverse=True)
        if quick:
            text += (f" At {tokens_text(top)} tokens " + ", ".join(f"`{b}`" for _, b in quick[:-1])
                     + f" and `{quick[-1][1]}` are {fmt(quick[-1][0])}–{fmt(quick[0][0])}× faster per layer.")
    return text


def table_block(csv_path: Path, registered: Sequence[str]) -> tuple[str, str, str]:
    """``(block, doc, text)`` of one table: its block name, the Markdown file it goes to and its content.

    Args:
        csv_path: ``results/docs/<name>.csv`` (its sidecar ``<name>.json`` beside it).
        registered: every registered backend's name (the coverage line).
    """
    meta = read_sidecar(csv_path.with_suffix(".json"))
    header, rows = read_csv(csv_path)
    shown, cells = shown_cells(header, rows, meta.get("view"), csv_path)
    parts = [source_line(meta), "", markdown(shown, cells, meta.get("right") or ())]
    try:
        line = coverage(shown, cells, meta, registered)
    except ConfigError as e:
        raise ConfigError(f"{csv_path.with_suffix('.json')}: {e}") from None
    if line:
        parts += ["", line]
    if meta.get("view") == "layers":
        parts += ["", textwrap.fill(layer_summary(rows), WIDTH, break_long_words=False, break_on_hyphens=False)]
    return PREFIX + csv_path.stem, meta["doc"], "\n".join(parts)


def refresh_tables(root: Path, registered: Sequence[str], check: bool = False) -> list[str]:
    """Write (or with ``check`` compare) every table of ``root/results/docs`` into its doc, each doc written once.

    Returns one line per block that differs (``check``) or was rewritten.

    Args:
        root: the checkout; registered: every backend's name; check: compare only, write nothing.
    """
    by_doc: dict[str, list[tuple[str, str]]] = {}
    for path in sorted((root / FOLDER).glob("*.csv")):
        block, doc, text = table_block(path, registered)
        by_doc.setdefault(doc, []).append((block, text))
    changed = []
    for doc, blocks in by_doc.items():
        content = new = read_docs(root / doc)
        for block, text in blocks:
            before, new = new, with_block(new, text, block, root / doc)
            if new != before:
                changed.append(f"{doc}: the {block} block differs from {FOLDER}/{block[len(PREFIX):]}.csv")
        if new != content and not check:
            atomic_write_text(root / doc, new)
    return changed


# ------------------------------------------------------------------------- figures quoted outside the tables

NUM = r"\d+(?:,\d{3})*(?:\.\d+)?"
# a measured figure: a number (or a range a–b) with a unit; "396.3 training images/s" counts
FIGURE = re.compile(rf"(?<![\w.,])({NUM})(?:–({NUM}))?(?: (?:training|inference))? ?"
                    r"(%|×|images/s|img/s|ms|s|MB|GB|GMACs|points)(?!\w)")
BLOCK = re.compile(r"<!-- ([a-z0-9:-]+):begin -->(.*?)<!-- \1:end -->", re.DOTALL)


def plain(text: str) -> str:
    """``text`` with thousands separators dropped (``1,024`` -> ``1024``)."""
    return re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)


def generated_text(markdown_text: str) -> str:
    """The content of every generated block (``<!-- NAME:begin -->`` ... ``<!-- NAME:end -->``) of a Markdown text."""
    return "\n".join(m.group(2) for m in BLOCK.finditer(markdown_text))


def unquoted_figures(text: str, generated: str) -> list[str]:
    """The figures of ``text`` (numbers with a unit, each end of a range) that no generated block holds.

    Args:
        text: the prose to check (README's results in brief); generated: the blocks' text (:func:`generated_text`).
    """
    held = plain(generated)
    missing = []
    for m in FIGURE.finditer(text):
        for number in filter(None, m.group(1, 2)):
            if not re.search(rf"(?<![\d.]){re.escape(plain(number))}(?!\d|\.\d)", held):
                missing.append(f"{number} {m.group(3)}")
    return missing
