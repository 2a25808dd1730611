"""Plain formatting for the FLOPs tables: human-readable MACs, Markdown, CSV and rich console tables."""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Optional

from vitzoo.fileio import atomic_write_text


def human(macs: Optional[float]) -> str:
    """``4509215744`` -> ``"4.509 G"``."""
    if macs is None:
        return "—"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(macs) >= scale:
            return f"{macs / scale:.4g} {unit}" if abs(macs) / scale < 100 else f"{macs / scale:.1f} {unit}"
    return f"{macs:.0f}"


def signed(diff: Optional[int]) -> str:
    if diff is None:
        return "—"
    return "0" if diff == 0 else f"{diff:+,d}"


def gmacs(macs: Optional[float], digits: int = 4) -> str:
    return "—" if macs is None else f"{macs / 1e9:.{digits}f}"


def markdown(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    """``header`` and ``rows`` as a CSV file, written atomically and never through a symbolic link."""
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def print_table(title: str, header: list[str], rows: list[list[Any]], justify_right: set[int] = frozenset()) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False, header_style="bold")
    for i, h in enumerate(header):
        table.add_column(h, justify="right" if i in justify_right else "left", overflow="fold")
    for row in rows:
        table.add_row(*(str(v) for v in row))
    Console(width=max(160, Console().width)).print(table)
