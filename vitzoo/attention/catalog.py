"""The registry's cost text for readers, generated so that no copy can disagree with the code.

Each backend's class attribute ``formula`` is the one source of its cost text; its capability flags, its
family (the subpackage of its module) and its config dataclass's fields are the one source of the other
columns. From them this module writes:

* the "Attention backends" table of ``docs/backends.md``, between :data:`BEGIN` and :data:`END`
  (the prose around the markers is written by hand);
* the ``Cost <formula>.`` sentence that ends the first line of each ``configs/attention/<name>.yaml``
  (the description before it, naming the paper, is written by hand).

``python scripts/gen_docs.py`` rewrites both (and docs/flops.md's formula table, from :mod:`vitzoo.flops`);
``--check`` lists every file and block that differs.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import re
from pathlib import Path

import torch

from vitzoo.attention import ATTENTION, MixerContext, attention_family, build_attention, list_attention
from vitzoo.configs import CONFIG_DIR, attention_options
from vitzoo.costs import saved_bytes
from vitzoo.fileio import atomic_write_text, splice_block

BLOCK = "formulas"
BEGIN = f"<!-- generated:{BLOCK}:begin (python scripts/gen_docs.py) -->"
END = f"<!-- generated:{BLOCK}:end -->"
FLAGS = ("fixed_length",)  # capability flags the table's "notes" column lists
GROWTH_GRID = (16, 16)  # grid at which an instance (built with its YAML options) reports ``linear_cost``
COST = re.compile(r"^(#.*?)Cost .*$")  # the YAML's first line: "# <description>. Cost <formula>."
MEMORY_GRID, MEMORY_DIM, MEMORY_HEADS, MEMORY_WINDOW = (32, 32), 128, 4, 8  # the memory column's layer
HEADER = ("| attention | formula (multiply-adds, one image) | cost grows | saved for backward: fp32 · bf16, largest "
          "| notes | subpackage | options |\n|---|---|---|---|---|---|---|")


@dataclasses.dataclass(frozen=True)
class BackendEntry:
    """What the docs say about one registered backend.

    Args:
        name: registry name, e.g. ``"performer"``.
        formula: the class attribute ``formula``.
        linear_cost: an instance built with the YAML options grows linearly in N.
        flags: the capability flags of :data:`FLAGS` the class sets.
        family: the subpackage of ``vitzoo.attention`` the class lives in.
        options: the config dataclass's fields, in order.
        memory: what one layer's ``memory()`` keeps for backward (see :func:`memory_text`).
    """

    name: str
    formula: str
    linear_cost: bool
    flags: tuple[str, ...]
    family: str
    options: tuple[str, ...]
    memory: str


@functools.lru_cache(maxsize=None)  # the registry does not change within a process
def backend_entry(name: str) -> BackendEntry:
    """The :class:`BackendEntry` of one backend, read from its class, config dataclass and YAML options.

    Args:
        name: a registered backend.
    """
    list_attention()  # imports every backend
    cls, config_cls = ATTENTION.get(name)
    if not cls.formula:
        raise ValueError(f"attention '{name}': {cls.__name__} has no class attribute formula")
    # linear_in can depend on the options (multi_pattern's global heads): asked for the YAML options
    ctx = MixerContext(dim=32, num_heads=4, grid=GROWTH_GRID, num_prefix=0, window=4)
    mixer = build_attention(attention_options(name), ctx)
    return BackendEntry(
        name=name, formula=cls.formula, linear_cost=mixer.grows_linearly,
        flags=tuple(f for f in FLAGS if getattr(cls, f)), family=attention_family(name),
        options=tuple(f.name for f in dataclasses.fields(config_cls) if f.init), memory=memory_text(name))


def memory_text(name: str) -> str:
    """``"4.19 · 2.10 MiB; q|k|v (projection output), attention output"``: the bytes one layer's ``memory()``
    lists (1,024 grid tokens, C = 128, 4 heads, no prefix token, one image, in fp32 and under bf16 autocast) and
    its two largest tensors in fp32.

    Args:
        name: a registered backend (built with its YAML options; a null window is 8).
    """
    ctx = MixerContext(dim=MEMORY_DIM, num_heads=MEMORY_HEADS, grid=MEMORY_GRID, num_prefix=0, window=MEMORY_WINDOW)
    mixer = build_attention(attention_options(name), ctx)
    fp32, bf16 = mixer.memory(MEMORY_GRID, 1, None), mixer.memory(MEMORY_GRID, 1, torch.bfloat16)
    largest = [s.name.replace("|", "\\|") for s in sorted(fp32, key=lambda s: -s.nbytes)[:2]]  # a table cell
    mib = 2 ** 20
    return f"{saved_bytes(fp32) / mib:.2f} · {saved_bytes(bf16) / mib:.2f} MiB; {', '.join(largest)}"


def backend_table(entries: list[BackendEntry]) -> str:
    """The markdown table of ``docs/backends.md``, one row per entry (header included, no trailing newline).

    Args:
        entries: the backends, in the order of the rows.
    """
    rows = [HEADER]
    for e in entries:
        growth = "linear in N" if e.linear_cost else "super-linear"
        options = ", ".join(f"`{o}`" for o in e.options) or "(none)"
        rows.append(f"| `{e.name}` | `{e.formula}` | {growth} | {e.memory} | {', '.join(e.flags)} | `{e.family}/` "
                    f"| {options} |")
    return "\n".join(rows)


def replace_block(text: str, body: str, where: str) -> str:
    """``text`` with the lines between :data:`BEGIN` and :data:`END` replaced by ``body`` (a blank line each side).

    Args:
        text: the document.
        body: the generated text (without the markers).
        where: the document's name, for the error when a marker is missing.
    """
    return splice_block(text, f"\n\n{body}\n\n", BEGIN, END, where)


def yaml_with_cost(text: str, formula: str, where: str) -> str:
    """``text`` (a ``configs/attention/<name>.yaml``) with its first line ending in ``Cost <formula>.``.

    Args:
        text: the YAML file's text.
        formula: the class attribute ``formula``.
        where: the file's name, for the error when the first line has no cost sentence.
    """
    first, sep, rest = text.partition("\n")
    match = COST.match(first)
    if not match:
        raise ValueError(f"{where}: the first line must be '# <description>. Cost <formula>.'")
    return f"{match.group(1)}Cost {formula}.{sep}{rest}"


def generated_files(doc: Path, conf_dir: Path = CONFIG_DIR / "attention") -> dict[Path, tuple[str, str]]:
    """``{path: (block, text)}``: every file the generator writes, with the text it should hold.

    Args:
        doc: ``docs/backends.md`` (or a copy of it).
        conf_dir: the folder of ``<name>.yaml`` files.
    """
    names = list_attention()
    entries = [backend_entry(name) for name in names]
    out = {doc: (f"block {BLOCK}", replace_block(doc.read_text(encoding="utf-8"), backend_table(entries), str(doc)))}
    for e in entries:
        path = conf_dir / f"{e.name}.yaml"
        if not path.is_file():
            raise ValueError(f"attention '{e.name}': no {path}")
        out[path] = ("line 1 (cost)", yaml_with_cost(path.read_text(encoding="utf-8"), e.formula, str(path)))
    return out


def check(doc: Path, conf_dir: Path = CONFIG_DIR / "attention") -> list[str]:
    """One message per file whose text differs from the generated text, with the differing lines.

    Args:
        doc: ``docs/backends.md`` (or a copy of it).
        conf_dir: the folder of ``<name>.yaml`` files.
    """
    return differences(generated_files(doc, conf_dir))


def differences(files: dict[Path, tuple[str, str]]) -> list[str]:
    """One message per file whose text differs from the text it should hold, with the differing lines.

    Args:
        files: ``{path: (block, text)}`` as :func:`generated_files` gives it (other generators add theirs).
    """
    problems = []
    for path, (block, want) in files.items():
        have = path.read_text(encoding="utf-8")
        if have != want:
            diff = difflib.unified_diff(have.splitlines(), want.splitlines(), "committed", "generated", n=0,
                                        lineterm="")
            lines = [f"    {ln}" for ln in diff if ln[:1] in "-+" and ln[:3] not in ("---", "+++")]
            problems.append("\n".join([f"{path}: {block} differs from the registry", *lines]))
    return problems


def write(doc: Path, conf_dir: Path = CONFIG_DIR / "attention") -> list[Path]:
    """Rewrite every generated file that differs; returns the files written.

    Args:
        doc: ``docs/backends.md`` (or a copy of it).
        conf_dir: the folder of ``<name>.yaml`` files.
    """
    return write_files(generated_files(doc, conf_dir))


def write_files(files: dict[Path, tuple[str, str]]) -> list[Path]:
    """Rewrite (atomically) every file whose text differs; returns the files written.

    Args:
        files: ``{path: (block, text)}`` as :func:`generated_files` gives it.
    """
    written = []
    for path, (_, want) in files.items():
        if path.read_text(encoding="utf-8") != want:
            atomic_write_text(path, want)
            written.append(path)
    return written
