#!/usr/bin/env python
"""Write the cost text that docs/backends.md, docs/flops.md and configs/attention/<name>.yaml repeat, from the registry.

    python scripts/gen_docs.py            # rewrite the two docs tables and each YAML's "Cost <formula>." sentence
    python scripts/gen_docs.py --check    # exit 1, naming each file and block that differs; one line if none

The logic lives in :mod:`vitzoo.attention.catalog` (backend table, YAML lines) and
:func:`vitzoo.flops.sweeps.formula_table` (docs/flops.md's "Every backend's formula": formula, symbols and
``flops()`` at a 14×14, C = 128, h = 4 layer).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from vitzoo.attention import catalog, list_attention
from vitzoo.fileio import splice_block
from vitzoo.flops.sweeps import formula_table

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "backends.md"
FLOPS_DOC = ROOT / "docs" / "flops.md"
FLOPS_BEGIN = "<!-- generated:flops-formulas:begin (python scripts/gen_docs.py) -->"
FLOPS_END = "<!-- generated:flops-formulas:end -->"


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


def main(argv: Optional[Sequence[str]] = None, doc: Path = DOC,
         conf_dir: Path = catalog.CONFIG_DIR / "attention", flops_doc: Path = FLOPS_DOC) -> int:
    """Rewrite (or with ``--check`` compare) the generated text; returns the exit status.

    Args:
        argv: command-line arguments (default: ``sys.argv[1:]``).
        doc: the backends page to generate into.
        conf_dir: the folder of ``<name>.yaml`` files.
        flops_doc: the FLOPs page whose formula table is generated.
    """
    parser = argparse.ArgumentParser(prog="python scripts/gen_docs.py", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = catalog.differences(generated(doc, conf_dir, flops_doc))
            for problem in problems:
                print(problem.replace(str(ROOT) + "/", ""), file=sys.stderr)
            if problems:
                print(f"{len(problems)} generated file(s) differ: run python scripts/gen_docs.py", file=sys.stderr)
                return 1
            print(f"generated text up to date: {shown(doc)}, {shown(flops_doc)} and {shown(conf_dir)}/*.yaml")
            return 0
        written = catalog.write_files(generated(doc, conf_dir, flops_doc))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {len(written)} file(s)" + "".join(f"\n  {shown(p)}" for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
