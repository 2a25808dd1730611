"""The package layout: who may import whom (parsed with ``ast``), and no oversized modules."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "vitzoo"
MAX_LINES = 400
LONG_FILES = {  # path -> why it may exceed MAX_LINES
    "vitzoo/attention/_sparse.py": "sparse-pattern helpers (~450 lines): outside the FLOPs split, still to be split",
}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports (``import a.b`` -> ``a.b``; ``from a.b import c`` -> ``a.b`` and ``a.b.c``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (PACKAGE / folder).rglob("*.py"))


def hits(path: Path, banned: tuple[str, ...]) -> list[str]:
    return sorted(m for m in imported_modules(path) if any(m == b or m.startswith(b + ".") for b in banned))


@pytest.mark.parametrize("path", files("flops"), ids=lambda p: p.name)
def test_flops_imports_no_backbone_and_no_layer(path):
    """vitzoo.flops walks ``flops``/``flops_children`` by duck typing: it names no backbone or layer class."""
    assert not hits(path, ("vitzoo.models", "vitzoo.layers")), path


@pytest.mark.parametrize("path", files("models", "layers", "attention"), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_models_layers_attention_import_neither_flops_nor_bench(path):
    assert not hits(path, ("vitzoo.flops", "vitzoo.bench")), path


def test_no_module_over_400_lines_unless_listed():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    too_long = {p: n for p, n in sizes.items() if n > MAX_LINES and p not in LONG_FILES}
    assert not too_long, f"split these modules (or list them with a reason in LONG_FILES): {too_long}"
    assert all(sizes.get(p, 0) > MAX_LINES for p in LONG_FILES), "a listed file is short now: drop it from LONG_FILES"
