"""Each backend's class attribute ``formula`` is the one source of its cost text.

docs/backends.md's "Attention backends" table and the first line of ``configs/attention/<name>.yaml``
repeat it; these tests keep both copies equal to the class attribute, and the table's rows equal
to the registry.
"""
from __future__ import annotations

import re

import pytest
from conftest import ATTENTION_NAMES, CONFIGS, ROOT, attention_classes, make_attention

BACKENDS_DOC = ROOT / "docs" / "backends.md"
ROW = re.compile(r"^\| `([^`]+)` \| `([^`]*)` \| ([^|]*) \| ([^|]*) \|")
FLAGS = ("fixed_length",)  # capability flags the table's "notes" column lists


def readme_rows() -> dict[str, tuple[str, str, str]]:
    """``{backend: (formula, growth, notes)}`` from the rows of docs/backends.md's "Attention backends" table."""
    text = BACKENDS_DOC.read_text(encoding="utf-8")
    section = text.split("## Attention backends", 1)[1].split("\n## ", 1)[0]
    rows = [ROW.match(line) for line in section.splitlines()]
    return {m.group(1): (m.group(2), m.group(3).strip(), m.group(4).strip()) for m in rows if m}


def readme_formulas() -> dict[str, str]:
    """``{backend: formula}`` from docs/backends.md's table."""
    return {name: row[0] for name, row in readme_rows().items()}


def test_readme_table_lists_exactly_the_registered_backends():
    assert sorted(readme_formulas()) == sorted(ATTENTION_NAMES)


@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_readme_row_shows_the_class_formula(name):
    assert readme_formulas().get(name) == attention_classes()[name].formula


@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_yaml_first_line_contains_the_class_formula(name):
    first = (CONFIGS / "attention" / f"{name}.yaml").read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# "), f"{name}.yaml must start with a one-line description comment"
    assert attention_classes()[name].formula in first, f"{name}.yaml: {first!r}"


@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_readme_row_shows_the_class_flags(name):
    """The "cost grows" and "notes" columns follow ``linear_cost`` (as the YAML defaults build it) and the
    class's capability flags."""
    cls = attention_classes()[name]
    _, growth, notes = readme_rows()[name]
    assert growth == ("linear in N" if make_attention(name, (16, 16), 0).linear_cost else "super-linear")
    assert notes == ", ".join(f for f in FLAGS if getattr(cls, f))


def flops_doc_formulas() -> dict[str, str]:
    """``{backend: formula}`` from docs/flops.md's "Every backend's formula" table (``scripts/flops.py --formulas``)."""
    text = (ROOT / "docs" / "flops.md").read_text(encoding="utf-8")
    section = text.split("## Every backend's formula", 1)[1].split("\n## ", 1)[0]
    rows = [re.match(r"^\| `([^`]+)` \| `([^`]*)` \|", line) for line in section.splitlines()]
    return {m.group(1): m.group(2) for m in rows if m}


def test_flops_doc_table_repeats_each_class_formula():
    assert flops_doc_formulas() == {name: attention_classes()[name].formula for name in ATTENTION_NAMES}
