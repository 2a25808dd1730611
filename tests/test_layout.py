"""Package layering, read from the source with ``ast`` (nothing is imported), and module sizes.

Every top-level module and package of vitzoo has one place in :data:`ORDER` (no two share a tier) and imports only
those before it, not even lazily inside a function, so the package graph has no cycle:

registry < fileio < quiet < costs < configs < untrusted < measure < cpu_kernels < ops < attention < layers
< models < data < export < vitzoo (its ``__init__``) < flops < training < bench < train < eval

No module imports itself back through others; a private module (``_x.py``) is imported only inside its own
package; ``vitzoo.flops`` counts by duck typing (``flops``/``flops_children``) and names no backbone or layer;
scripts/ use the installed package instead of editing ``sys.path``; no library module is over 400 lines.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "vitzoo"
# lowest first: each imports only those before it. measure (timing, memory, the machine) is a leaf under training
# and bench; bench (benchmark runs, ranking, charts, GPU checks) may import training, never the other way
ORDER = [
    "vitzoo.registry", "vitzoo.fileio", "vitzoo.quiet", "vitzoo.costs", "vitzoo.configs", "vitzoo.untrusted",
    "vitzoo.measure", "vitzoo.cpu_kernels", "vitzoo.ops", "vitzoo.attention", "vitzoo.layers", "vitzoo.models",
    "vitzoo.data", "vitzoo.export", "vitzoo", "vitzoo.flops", "vitzoo.training", "vitzoo.bench", "vitzoo.train",
    "vitzoo.eval",
]
MAX_LINES = 400
LONG_FILES: dict[str, str] = {}  # path -> why it may exceed MAX_LINES


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_statements(path: Path, root: Path = ROOT) -> list[tuple[str, list[str]]]:
    """Every import of ``path`` at any depth of the file, as ``(module, names)``: ``import a.b`` gives
    ``("a.b", [])``, ``from a import b, c`` gives ``("a", ["b", "c"])`` (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            found.append((base, [alias.name for alias in node.names]))
    return found


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Absolute names of every module ``path`` imports, at any depth of the file (relative imports resolved)."""
    names = set()
    for base, aliases in import_statements(path, root):
        names.add(base)
        names.update(f"{base}.{alias}" for alias in aliases)  # `from vitzoo import flops`
    return names


def unit(name: str) -> str:
    """The top-level module or package of vitzoo that module ``name`` is part of: ``vitzoo.models.vit`` ->
    ``vitzoo.models``; ``vitzoo`` is the package's ``__init__`` (``create_model``, ``__version__`` ...)."""
    return ".".join(name.split(".")[:2])


def imported_units(path: Path, units: set[str], root: Path = ROOT) -> set[str]:
    """The top-level modules and packages of vitzoo that ``path`` imports: ``from vitzoo import flops`` is
    ``vitzoo.flops``, ``from vitzoo import __version__`` and ``import vitzoo`` are vitzoo's ``__init__``.

    Args:
        path: a Python file.
        units: the top-level modules and packages (:func:`unit` of every module).
        root: the folder holding the ``vitzoo`` package.
    """
    found = set()
    for base, aliases in import_statements(path, root):
        if base == "vitzoo" and aliases:
            found.update(f"vitzoo.{a}" if f"vitzoo.{a}" in units else "vitzoo" for a in aliases)
        elif within(base, "vitzoo"):
            found.add(unit(base))
    return found


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
    units = {"vitzoo", "vitzoo.flops", "vitzoo.models", "vitzoo.attention"}
    assert imported_units(f, units, root=tmp_path) == {"vitzoo.flops", "vitzoo.models"}
    f.write_text("import vitzoo\nfrom vitzoo import __version__\nfrom . import base\n")
    assert imported_units(f, units, root=tmp_path) == {"vitzoo", "vitzoo.attention"}


MODULES = sorted(PACKAGE.rglob("*.py"))
UNITS = {unit(module_name(p)) for p in MODULES}


def test_order_places_every_package_once():
    """A new top-level module or package gets its place in ORDER; none shares a tier."""
    assert len(set(ORDER)) == len(ORDER) and set(ORDER) == UNITS, sorted(UNITS ^ set(ORDER))


@pytest.mark.parametrize("layer", ORDER)
def test_no_package_imports_a_later_one(layer):
    offences = []
    for path in MODULES:
        if unit(module_name(path)) != layer:
            continue
        for name in sorted(imported_units(path, UNITS)):
            if name not in ORDER or ORDER.index(name) > ORDER.index(layer):
                offences.append(f"{path.relative_to(ROOT)} imports {name}, which comes after {layer}")
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


def package_graph() -> dict[str, set[str]]:
    """Top-level module or package -> the others it imports (any module of it, at any depth of the file)."""
    graph: dict[str, set[str]] = {u: set() for u in UNITS}
    for path in MODULES:
        own = unit(module_name(path))
        graph[own] |= imported_units(path, UNITS) - {own}
    return graph


def test_no_cycle_between_packages():
    """Modules of two packages may import each other without a module-level cycle; packages may not."""
    cycle = find_cycle(package_graph())
    assert not cycle, "package import cycle: " + " -> ".join(cycle)


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


def test_wheel_lists_every_package_and_ships_the_top_level_configs():
    """pyproject.toml names its packages (configs/ is mapped into the wheel as vitzoo.conf): a new subpackage
    missing from the list would be missing from the wheel."""
    import tomllib

    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "vitzoo").rglob("__init__.py")}
    assert set(setup["packages"]) == folders | {"vitzoo.conf"}
    assert setup["package-dir"] == {"vitzoo.conf": "configs"}
    assert (ROOT / "configs" / "train.yaml").is_file() and not (ROOT / "vitzoo" / "conf").exists()


def test_test_files_have_distinct_names():
    """pytest imports test files without packages by their file name: two files of one name in different folders
    fail to import ("import file mismatch")."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
