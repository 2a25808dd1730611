"""Nothing vitzoo writes follows a symbolic link (docs/usage.md): every write in the package, the scripts and the
tools goes through vitzoo.fileio (an atomic file, a new file) or a staging folder, never through an ``open`` for
writing, ``Path.write_text`` / ``write_bytes`` or a ``savefig`` to a path."""
from __future__ import annotations

import ast

from conftest import ROOT

SOURCES = ("vitzoo", "scripts", "tools")
ALLOWED = {  # file -> why its write is not one that a link could redirect
    "vitzoo/measure/memory.py": "writes /proc/self/clear_refs, a kernel file of this process",
}
WRITE_MODES = set("wax+")


def _mode(call: ast.Call, position: int) -> str:
    """The constant ``mode`` of an ``open`` call ('' when not given or not a constant)."""
    args = [*call.args[position:position + 1], *(k.value for k in call.keywords if k.arg == "mode")]
    return next((a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)), "")


def writes_by_name(source: str) -> list[int]:
    """Lines of ``source`` that write a file by its name: ``open(p, "w")``, ``p.open("a")``, ``p.write_text(...)``,
    ``p.write_bytes(...)`` or ``fig.savefig(p)`` without ``format=`` (a buffer written atomically has one)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name in ("write_text", "write_bytes") and isinstance(f, ast.Attribute):
            lines.append(node.lineno)
        elif name == "open" and set(_mode(node, 1 if isinstance(f, ast.Name) else 0)) & WRITE_MODES:
            lines.append(node.lineno)
        elif name == "savefig" and not any(k.arg == "format" for k in node.keywords):
            lines.append(node.lineno)
    return lines


def test_the_detector_finds_each_kind_of_write_by_name():
    src = ("open(p, 'w')\nopen(p, mode='ab')\np.open('a')\np.write_text('x')\np.write_bytes(b'')\nfig.savefig(p)\n"
           "open(p)\np.open()\nfig.savefig(buf, format='png')\natomic_write_text(p, 'x')\n")
    assert writes_by_name(src) == [1, 2, 3, 4, 5, 6]


def test_every_write_goes_through_fileio():
    found = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in ALLOWED:
                found += [f"{rel}:{line}" for line in writes_by_name(path.read_text())]
    assert not found, f"writes that may follow a symbolic link (use vitzoo.fileio): {found}"


def test_allowed_files_still_write():
    for rel in ALLOWED:
        assert writes_by_name((ROOT / rel).read_text()), f"{rel} writes nothing by name: drop it from ALLOWED"
