"""Generated blocks in Markdown files: ``<!-- NAME:begin -->`` ... ``<!-- NAME:end -->``, replaced in place by the
commands that generate them (``scripts/compare.py --docs``, ``scripts/ablation.py``, ``scripts/convergence.py``),
each block once per file, atomically, never through a symbolic link."""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from vitzoo.fileio import atomic_write_text, read_regular_text, splice_block
from vitzoo.registry import ConfigError


def block_markers(block: str) -> tuple[str, str]:
    """The begin and end comments of the generated block ``block``: ``<!-- block:begin -->``, ``<!-- block:end -->``.

    Args:
        block: lower-case letters, digits and dashes, with at most one ``prefix:`` (``results:models``).
    """
    if not re.fullmatch(r"([a-z0-9][a-z0-9-]*:)?[a-z0-9][a-z0-9-]*", block or ""):
        raise ConfigError(f"--block {block!r}: use lower-case letters, digits and dashes (one 'prefix:' allowed)")
    return f"<!-- {block}:begin -->", f"<!-- {block}:end -->"


def read_docs(markdown: Any) -> str:
    """The text of the ``--docs`` file: a regular file that exists and is no symbolic link, else one line.

    Args:
        markdown: the Markdown file.
    """
    markdown = Path(markdown)
    if markdown.is_symlink():
        raise ConfigError(f"--docs {markdown} is a symbolic link; name the file itself")
    if not markdown.exists():
        raise ConfigError(f"--docs {markdown}: no such file")
    try:
        return read_regular_text(markdown)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--docs {markdown}: not readable ({getattr(e, 'strerror', None) or type(e).__name__})"
                          ) from None


def with_block(content: str, text: str, block: str, where: Any = "--docs") -> str:
    """``content`` with its generated block ``block`` (between its :func:`block_markers`) replaced by ``text``.

    ``content`` must hold each marker once, begin before end, and ``text`` neither; else one line naming
    ``where``. The same ``text`` gives ``content`` back byte for byte.

    Args:
        content: the Markdown text; text: the block's new content; block: the block's name;
        where: how the one-line error names the file (``--docs <path>``).
    """
    return splice_block(content, f"\n{text}\n", *block_markers(block), where)


def replace_block(markdown: Path, text: str, block: str = "cifar10-ranking") -> Path:
    """Replace the generated block ``block`` in ``markdown`` with ``text`` (:func:`with_block`), atomically.

    The file must be a regular file (not a symbolic link). Replacing the block with the same text leaves the
    file byte for byte as it was.

    Args:
        markdown: the Markdown file (``--docs``).
        text: the new content of the block.
        block: the block's name (``--block``).
    """
    return atomic_write_text(markdown, with_block(read_docs(markdown), text, block, f"--docs {markdown}"))


def refresh_block(markdown: Any, text: str, block: str, check: bool = False) -> int:
    """Write ``text`` into the block ``block`` of ``markdown`` (a no-op when it is already there), or with
    ``check`` only compare: 0 when the block holds ``text``, 1 (with one line on stderr) when it differs.

    Args:
        markdown: the Markdown file (``--docs``); text: the block's content; block: its name;
        check: compare only, write nothing (``--check``).
    """
    content = read_docs(markdown)
    new = with_block(content, text, block, f"--docs {markdown}")
    if check:
        if new != content:
            print(f"{markdown}: the {block} block differs from what generates it; run without --check",
                  file=sys.stderr)
            return 1
        print(f"{markdown}: the {block} block matches")
        return 0
    if new != content:
        atomic_write_text(markdown, new)
    print(f"wrote the {block} block of {markdown}")
    return 0
