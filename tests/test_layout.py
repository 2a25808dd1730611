"""Package layering, read from the source with ``ast`` (nothing is imported), and module sizes.

cpu_kernels  <-  attention  <-  layers  <-  models  <-  data / export  <-  training / flops / bench

A lower layer never imports a higher one (not even lazily inside a function); no module imports itself back
through others; a private module (``_x.py``) is imported only inside its own package; ``vitzoo.flops``
counts by duck typing (``flops``/``flops_children``) and names no backbone or layer; scripts/ use
the installed package instead of editing ``sys.path``; no library module is over 400 lines.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "vitzoo"
HIGHER = ["vitzoo.layers", "vitzoo.models", "vitzoo.training", "vitzoo.flops", "vitzoo.bench"]
FORBIDDEN = {
    "vitzoo.cpu_kernels": ["vitzoo.attention"] + HIGHER,
    "vitzoo.attention": HIGHER,
    "vitzoo.layers": HIGHER[1:],
    "vitzoo.models": HIGHER[2:],
    "vitzoo.flops": ["vitzoo.layers", "vitzoo.models", "vitzoo.training", "vitzoo.bench"],
    "vitzoo.data": ["vitzoo.export", "vitzoo.training", "vitzoo.flops", "vitzoo.bench"],
    "vitzoo.export": ["vitzoo.training", "vitzoo.flops", "vitzoo.bench"],
}
MAX_LINES = 400
LONG_FILES: dict[str, str] = {}  # path -> why it may exceed MAX_LINES


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Absolute names of every module ``path`` imports, at any depth of the file (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from vitzoo import flops`
    return names


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_import_parser_sees_imports_at_any_depth(tmp_path):
    """The checker itself: lazy imports inside functions and `from vitzoo import x` count."""
    pkg = tmp_path / "vitzoo" / "attention"
    pkg.mkdir(parents=True)
    f = pkg / "demo.py"
    f.write_text("def f():\n    from vitzoo import flops\n    from ..models import swin\n")
    names = imported_modules(f, root=tmp_path)
    assert "vitzoo.flops" in names and "vitzoo.models.swin" in names


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_higher_ones(layer):
    offences = []
    for path in MODULES:
        if not within(module_name(path), layer):
            continue
        for name in sorted(imported_modules(path)):
            if any(within(name, higher) for higher in FORBIDDEN[layer]):
                offences.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offences, "\n".join(offences)


def import_graph() -> dict[str, set[str]]:
    """Module -> the vitzoo modules it imports (at any depth of the file)."""
    names = {module_name(p) for p in MODULES}
    return {module_name(p): {n for n in imported_modules(p) if n in names and n != module_name(p)} for p in MODULES}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` as ``[a, b, ..., a]`` (depth-first search), or ``[]``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_cycle_finder():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_private_modules_are_imported_only_inside_their_package():
    offences = []
    for module, imported in import_graph().items():
        for name in sorted(imported):
            package, _, leaf = name.rpartition(".")
            if leaf.startswith("_") and not leaf.startswith("__") and not within(module, package):
                offences.append(f"{module} imports {name}")
    assert not offences, "\n".join(offences)


def edits_sys_path(source: str) -> bool:
    """True when ``source`` calls a method of ``sys.path`` (insert, append, …) or assigns to it."""
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and ast.unparse(node.func.value) == "sys.path"
        ):
            return True
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(ast.unparse(t).startswith("sys.path") for t in targets):
                return True
    return False


def test_sys_path_detector():
    assert edits_sys_path("import sys\nsys.path.insert(0, 'x')\n")
    assert edits_sys_path("import sys\nsys.path += ['x']\n")
    assert not edits_sys_path("import sys\nprint(sys.path)\n")


def test_scripts_do_not_edit_sys_path():
    offenders = [
        str(p.relative_to(ROOT)) for p in sorted((ROOT / "scripts").glob("*.py")) if edits_sys_path(p.read_text())
    ]
    assert not offenders, f"scripts editing sys.path: {offenders}"


def test_no_module_over_400_lines_unless_listed():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in MODULES}
    too_long = {p: n for p, n in sizes.items() if n > MAX_LINES and p not in LONG_FILES}
    assert not too_long, f"split these modules (or list them with a reason in LONG_FILES): {too_long}"
    assert all(sizes.get(p, 0) > MAX_LINES for p in LONG_FILES), "a listed file is short now: drop it from LONG_FILES"
