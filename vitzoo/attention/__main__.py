"""A backend's options with their comments: ``python -m vitzoo.attention performer``.

Without a name, every backend with its paper and cost (the first line of its YAML). The options are read from
``configs/attention/<name>.yaml`` (what ``attention=<name>`` composes, each option with its comment) and
the backend's config dataclass (anything the YAML leaves out, at its default).
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
from typing import Optional, Sequence

import yaml

from vitzoo.attention import ATTENTION, list_attention
from vitzoo.configs import CONFIG_DIR


def describe(name: str) -> str:
    """The text shown for one backend: its YAML's description, then ``attention.<option>: value  # comment``.

    Args:
        name: a registered backend, e.g. ``"performer"``.
    """
    path = CONFIG_DIR / "attention" / f"{name}.yaml"
    lines = path.read_text().splitlines() if path.is_file() else []
    start = next((i for i, ln in enumerate(lines) if ln.startswith("name:")), len(lines))
    about = [ln[1:].strip() for ln in lines[:start] if ln.startswith("#")]  # the description above `name:`
    # below `name:` the YAML as written: top-level options as attention.<option>, comments and nested lines kept
    options = [ln if ln[:1] in (" ", "#", "-") else f"attention.{ln}" for ln in lines[start + 1:] if ln.strip()]
    in_yaml = set((yaml.safe_load(path.read_text()) or {}) if path.is_file() else {})
    list_attention()  # imports every backend
    config_class = ATTENTION.get(name)[1]
    rest = [f for f in dataclasses.fields(config_class) if f.init and f.name not in in_yaml]
    out = [f"attention={name}" + (f": {about[0]}" if about else ""), *(f"  {a}" for a in about[1:])]
    if not options and not rest:
        out.append("no options")
        return "\n".join(out)
    out.append(f"options (set one with attention.<option>=<value>; {path.relative_to(CONFIG_DIR.parent.parent)}):")
    out += [f"  {ln}" for ln in options]
    for f in rest:
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        out.append(f"  attention.{f.name}: {default!r}  # default of {config_class.__name__}")
    return "\n".join(out)


def summary() -> str:
    """Every backend, one line each: its name and the first line of its YAML (paper and cost)."""
    rows = []
    for name in list_attention():
        path = CONFIG_DIR / "attention" / f"{name}.yaml"
        first = path.read_text().splitlines()[0].lstrip("# ").strip() if path.is_file() else ""
        rows.append(f"{name:<14} {first}")
    return "\n".join(rows + ["", "python -m vitzoo.attention <name> shows one backend's options with their comments."])


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print :func:`summary` or :func:`describe`; an unknown name exits 1 with one line and the closest name.

    Args:
        argv: command-line arguments (default: ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(prog="python -m vitzoo.attention", description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", help="a backend (none: list every backend)")
    args = parser.parse_args(argv)
    if args.name is None:
        print(summary())
        return 0
    names = list_attention()
    if args.name not in names:
        close = difflib.get_close_matches(args.name, names, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        print(f"error: unknown attention '{args.name}'; {hint}choose one of: {', '.join(names)}", file=sys.stderr)
        return 1
    print(describe(args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
