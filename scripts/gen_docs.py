#!/usr/bin/env python
"""Write the cost text that docs/backends.md and configs/attention/<name>.yaml repeat, from the registry.

    python scripts/gen_docs.py            # rewrite the backend table and each YAML's "Cost <formula>." sentence
    python scripts/gen_docs.py --check    # exit 1, naming each file and block that differs; one line if none

The logic lives in :mod:`vitzoo.attention.catalog`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from vitzoo.attention import catalog

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "backends.md"


def shown(path: Path) -> str:
    """``path`` relative to the checkout where it lies inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: Optional[Sequence[str]] = None, doc: Path = DOC,
         conf_dir: Path = catalog.CONFIG_DIR / "attention") -> int:
    """Rewrite (or with ``--check`` compare) the generated text; returns the exit status.

    Args:
        argv: command-line arguments (default: ``sys.argv[1:]``).
        doc: the backends page to generate into.
        conf_dir: the folder of ``<name>.yaml`` files.
    """
    parser = argparse.ArgumentParser(prog="python scripts/gen_docs.py", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = catalog.check(doc, conf_dir)
            for problem in problems:
                print(problem.replace(str(ROOT) + "/", ""), file=sys.stderr)
            if problems:
                print(f"{len(problems)} generated file(s) differ: run python scripts/gen_docs.py", file=sys.stderr)
                return 1
            print(f"generated text up to date: {shown(doc)} and {shown(conf_dir)}/*.yaml")
            return 0
        written = catalog.write(doc, conf_dir)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {len(written)} file(s)" + "".join(f"\n  {shown(p)}" for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
