"""Components apart from kernels, read from the source with ``ast`` (nothing is imported): no module under
vitzoo/attention defines a ``torch.autograd.Function`` or calls the compiled CPU kernels; those live in
vitzoo/ops, which never imports vitzoo/attention."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT


def autograd_functions(tree: ast.AST) -> list[str]:
    """Classes of ``tree`` whose bases name ``Function`` (``torch.autograd.Function``, ``autograd.Function`` or an
    imported ``Function``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = [ast.unparse(b) for b in node.bases]
            if any(b == "Function" or b.endswith(".Function") for b in bases):
                found.append(node.name)
    return found


def imported(tree: ast.AST) -> set[str]:
    """Every module ``tree`` imports at any depth, with ``from a import b`` also as ``a.b``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def offences(folder: Path, forbidden: str) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        name = path.relative_to(ROOT)
        found += [f"{name} defines autograd.Function {cls}" for cls in autograd_functions(tree)]
        found += [f"{name} imports {mod}" for mod in sorted(imported(tree))
                  if mod == forbidden or mod.startswith(forbidden + ".")]
    return found


def test_detector():
    tree = ast.parse("import torch\nfrom torch.autograd import Function\nfrom vitzoo import cpu_kernels\n"
                     "class A(torch.autograd.Function): pass\nclass B(Function): pass\nclass C(object): pass\n")
    assert autograd_functions(tree) == ["A", "B"]
    assert "vitzoo.cpu_kernels" in imported(tree)


def test_attention_holds_no_kernels():
    """Each backend keeps its module, config, cost and reference; autograd Functions and compiled-kernel calls
    are in vitzoo/ops."""
    found = offences(ROOT / "vitzoo" / "attention", "vitzoo.cpu_kernels")
    assert not found, "\n".join(found)


def test_ops_never_imports_attention():
    found = [o for o in offences(ROOT / "vitzoo" / "ops", "vitzoo.attention") if "imports" in o]
    assert not found, "\n".join(found)


def test_only_ops_calls_the_compiled_kernels():
    """Outside vitzoo/cpu_kernels itself, only vitzoo/ops imports it."""
    found = []
    for folder in sorted(p for p in (ROOT / "vitzoo").iterdir() if p.is_dir() and p.name not in ("ops", "cpu_kernels")):
        found += [o for o in offences(folder, "vitzoo.cpu_kernels") if "imports" in o]
    assert not found, "\n".join(found)
