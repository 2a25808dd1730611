"""Project text: README's figures have one source, and no file tells the history of the work.

README.md quotes measurements (the CIFAR-10 column of "Choosing a backend", whose speed and memory columns
``scripts/backend_guide.py`` generates from the whole-model benchmark, and the bullets of "Results at a glance");
each figure must appear in docs/results.md, where every table names its machine, command, commit and date.
Project files describe what vitzoo is and does: wording about how it was developed
(numbered attempts, issue numbers, "today") and paths of one machine are errors.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest


def _root() -> Path:
    """The checkout's root: the nearest folder above this file that holds pyproject.toml."""
    for folder in Path(__file__).resolve().parents:
        if (folder / "pyproject.toml").is_file():
            return folder
    raise FileNotFoundError("no pyproject.toml above " + __file__)


ROOT = _root()
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "results.md"
BACKENDS = ROOT / "docs" / "backends.md"

NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
PROVENANCE = ("**Machine:**", "**Command:**", "**Commit:**", "**Date:**")

ORDINALS = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"
HISTORY = re.compile(
    rf"\b(?:{ORDINALS}|[0-9]+(?:st|nd|rd|th)) stop\b|\bstop-[0-9]+|\bsitting\b|\blease\b|\boutage\b"
    r"|\bissue [0-9]+|\bthis (?:session|task)\b|\bnumbered attempts?\b|\bre-measured\b"
    r"|\bbefore the layout change\b|\btoday\b|\bs[12][0-9]_[a-z]"
    r"|/wor[k]/|/home/[a-z]|/Users/[A-Za-z]",  # [k]: this pattern does not match itself
    re.IGNORECASE,
)
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".cpp", ".h", ".txt", ".cfg"}
PROJECT_GLOBS = (
    "*.md", "*.py", "*.toml", "docs/**/*", "configs/**/*", "vitzoo/**/*", "scripts/**/*", "tools/**/*",
    "tests/**/*", ".github/**/*",
)


def section(path: Path, heading: str) -> str:
    """The text of the ``## heading`` section of a Markdown file, up to the next ``## `` heading.

    Args:
        path: the Markdown file.
        heading: the heading's text, without the leading ``## ``.
    """
    text = path.read_text(encoding="utf-8")
    marker = f"\n## {heading}\n"
    assert marker in text, f"{path.name} has no '## {heading}' section"
    return text.split(marker, 1)[1].split("\n## ", 1)[0]


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the Markdown tables in ``text`` as lists of stripped cells (header and rule left out).

    Args:
        text: Markdown text.
    """
    rows, previous = [], ""
    for line in text.splitlines():
        if line.startswith("|") and not set(line) <= set("|-: "):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if previous.startswith("|"):
                rows.append(cells)
        previous = line
    return rows


def readme_backend_rows() -> dict[str, list[str]]:
    """``{backend: cells}`` of README's "Choosing a backend" table."""
    rows = table_rows(section(README, "Choosing a backend"))
    return {row[0].strip("`"): row for row in rows if row[0].startswith("`")}


def appears(number: str, text: str) -> bool:
    """Whether ``number`` occurs in ``text`` as a whole number (not as part of a longer one).

    Args:
        number: a figure as written, e.g. ``"1,433"`` or ``"15.08"``.
        text: where to look.
    """
    return re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d]|[.,]\d)", text) is not None


def test_readme_cifar10_column_is_pending_or_quotes_results():
    """The CIFAR-10 column reads "pending" until the sweep's table is in docs/results.md."""
    results = RESULTS.read_text(encoding="utf-8")
    for name, cells in readme_backend_rows().items():
        accuracy = cells[-1]
        if accuracy != "pending":
            figures = NUMBER.findall(accuracy)
            assert figures, f"{name}: CIFAR-10 cell {accuracy!r} is neither 'pending' nor a figure"
            assert all(appears(f, results) for f in figures), f"{name}: {accuracy!r} is not in docs/results.md"


def test_readme_results_summary_figures_are_in_results():
    """Every number in README's "Results at a glance" appears in docs/results.md."""
    results = RESULTS.read_text(encoding="utf-8")
    summary = section(README, "Results at a glance")
    figures = NUMBER.findall(summary)
    assert len(figures) >= 10, "README's summary lost its figures"
    missing = sorted({f for f in figures if not appears(f, results)})
    assert not missing, f"README quotes figures that docs/results.md does not hold: {missing}"


def test_readme_formulas_equal_the_backend_table():
    """README's cost column repeats docs/backends.md's formula (which tests/test_docs.py checks)."""
    formulas = {row[0].strip("`"): row[1].strip("`") for row in table_rows(section(BACKENDS, "Attention backends"))}
    for name, cells in readme_backend_rows().items():
        assert f"`{formulas.get(name)}`" in cells, f"README row {name!r} does not show {formulas.get(name)!r}"
    assert sorted(readme_backend_rows()) == sorted(formulas)


def test_every_results_table_names_machine_command_commit_and_date():
    """Each table of docs/results.md (outside "How to read the tables") has a provenance line above it."""
    text = RESULTS.read_text(encoding="utf-8")
    body = text.split("\n## How to read the tables\n", 1)[1].split("\n## ", 1)[1]
    provenance, previous = None, ""
    for number, line in enumerate(body.splitlines()):
        if line.startswith("#"):
            provenance = None if line.startswith("## ") else provenance
        if line.startswith("> ") and all(key in line for key in PROVENANCE):
            provenance = line
        if line.startswith("|") and not previous.startswith("|"):
            assert provenance, f"docs/results.md: the table at body line {number} has no provenance line above it"
        previous = line


def project_files() -> list[Path]:
    """Text files of the project (docs, configs, code, scripts, tools, tests), this file left out."""
    found = set()
    for pattern in PROJECT_GLOBS:
        for path in ROOT.glob(pattern):
            parts = set(path.relative_to(ROOT).parts)
            if path.is_file() and path.suffix in TEXT_SUFFIXES and not parts & {"__pycache__", ".git"}:
                found.add(path)
    found.discard(Path(__file__).resolve())
    return sorted(found)


def test_project_files_are_found():
    names = {path.relative_to(ROOT).as_posix() for path in project_files()}
    assert {"README.md", "CONTRIBUTING.md", "docs/results.md"} <= names
    assert not any(name.endswith("test_project_text.py") for name in names)


@pytest.mark.parametrize("group", ["docs", "code", "tests"])
def test_no_development_history_or_machine_paths(group):
    """No project file tells how the work went (stops, sittings, issue numbers, "today") or names a machine's paths."""
    hits = []
    for path in project_files():
        relative = path.relative_to(ROOT).as_posix()
        kind = "tests" if relative.startswith("tests/") else "docs" if path.suffix == ".md" else "code"
        if kind != group:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            match = HISTORY.search(line)
            if match:
                hits.append(f"{relative}:{number}: {match.group(0)!r}")
    assert not hits, "development history or machine paths:\n" + "\n".join(hits)
