#!/usr/bin/env python
"""Accuracy versus throughput: a folder of result records, or a Hydra multirun, as tables and a chart.

    python scripts/compare.py results/cifar10                  # committed records + the quiet benchmark
    python scripts/compare.py results/cifar10 --docs docs/results.md   # and refresh the generated block there
    python scripts/compare.py results/cifar10_short --docs docs/results.md --block cifar10-short-ranking
    python scripts/compare.py results/cifar10_short --docs docs/results.md --block cifar10-short-ranking --check
    python scripts/compare.py results/cifar10/3ep --top 3 --exclude global,window   # names, for follow-up runs
    python scripts/compare.py multirun/zoo_digits/<date>/<time>
    python scripts/compare.py multirun/zoo_digits/<date>/<time> --x infer --out docs/img
    python scripts/compare.py --sweep-command zoo_cifar10      # the sweep with every backend spelled out

A record folder (``seed*.json`` files written by ``record_dir=``) gives ``ranking.md``, ``ranking.csv`` and one
chart per budget (top-1 with its 95 % interval against training images/s from the benchmark's ``models.csv``,
bubble area = training peak memory, colour = attention family, Pareto front) in the folder (``--out``). Records
are checked on read: a bad one (not a regular file, not JSON, a field of the wrong type or out of range, an
unregistered model or backend, a top-1 outside its interval) is left out with one line on stderr naming its file
and field, and the count of those left out closes the output. Every file is written atomically under the output
folder with a fixed name; a symbolic link there is replaced, never written through.

Each job folder's ``results.json`` (written by ``train.py``) gives best validation accuracy,
training and inference throughput, peak memory, parameters and GMACs. A job that failed, is still
``running`` or has no ``results.json`` is listed as such (its backend read from
``.hydra/hydra.yaml`` / ``.hydra/overrides.yaml``), never dropped. Writes ``runs.csv``,
``runs.md`` and ``accuracy_vs_throughput.png`` (x throughput, y accuracy, bubble area peak
memory, one labelled bubble per run, Pareto front dashed) to ``<folder>/compare/`` (``--out``).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from vitzoo.bench.compare import compare_runs, sweep_command
from vitzoo.bench.docs_block import refresh_block
from vitzoo.bench.ranking import rank_records, top_backends
from vitzoo.registry import ConfigError


def is_record_folder(folder: str) -> bool:
    """True when ``folder`` holds result records (``seed*.json``) and no Hydra job folders."""
    path = Path(folder)
    return any(path.rglob("seed*.json")) and not any(path.rglob(".hydra"))


def ranking_block(folder: Any, docs: Any, benchmark: Optional[Any] = None) -> str:
    """The generated ranking block of ``docs`` from the records under ``folder``, writing nothing there: the
    tables and charts go to a temporary folder, the chart links point at ``folder``'s charts.

    Args:
        folder: the record folder; docs: the Markdown file the block is for; benchmark: as ``--benchmark``.
    """
    with tempfile.TemporaryDirectory() as tmp:
        res = rank_records(folder, benchmark, tmp)
    text = res["text"]
    for png in res["charts"]:
        target = os.path.relpath((Path(folder) / png.name).resolve(), Path(docs).resolve().parent)
        text = text.replace(f"]({png.name})", f"]({target})")
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", nargs="?", help="multirun folder (multirun/<task>/<date>/<time>) or any folder above jobs")
    p.add_argument("--out", default=None, help="output folder (default: <folder>/compare)")
    p.add_argument("--x", choices=["train", "infer"], default="train", help="throughput on the x axis")
    p.add_argument("--sweep-command", metavar="EXPERIMENT", nargs="?", const="zoo_digits", default=None,
                   help="print the multirun command for EXPERIMENT with every registered backend listed, and exit")
    p.add_argument("--benchmark", default=None, help="records: the quiet benchmark's models.csv, or a folder "
                   "of them (default <folder>/benchmark: every models.csv under it)")
    p.add_argument("--docs", default=None, help="records: Markdown file whose generated ranking block is replaced")
    p.add_argument("--block", default="cifar10-ranking",
                   help="records: name of that block (<!-- NAME:begin --> ... <!-- NAME:end -->), one per recipe")
    p.add_argument("--top", type=int, default=None, help="records: print the K most accurate vit_cifar backends")
    p.add_argument("--exclude", default="", help="records, with --top: comma-separated backends to leave out")
    p.add_argument("--check", action="store_true",
                   help="records, with --docs: exit 1 if the block differs from the records; write nothing")
    a = p.parse_args(argv)
    if a.sweep_command:
        print(sweep_command(a.sweep_command))
        return 0
    if not a.folder:
        p.error("give the multirun folder (or --sweep-command)")
    if is_record_folder(a.folder) or a.top is not None:
        try:
            if a.top is not None:  # names only on stdout (the sweep reads them); bad records on stderr
                skipped: list[str] = []
                names = top_backends(a.folder, a.top, [b for b in a.exclude.split(",") if b], skipped=skipped)
                for line in skipped:
                    print(f"skipped {line}", file=sys.stderr)
                print(",".join(names))
                return 0
            if a.check:
                if not a.docs:
                    p.error("--check compares the block of --docs; name the Markdown file")
                return refresh_block(a.docs, ranking_block(a.folder, a.docs, a.benchmark), a.block, check=True)
            res = rank_records(a.folder, a.benchmark, a.out, a.docs, a.block)
        except (ConfigError, OSError) as e:
            p.exit(2, f"error: {e}\n")
        print(res["text"])
        print(f"written: {res['md']}, {res['csv']}, " + ", ".join(map(str, res["charts"])))
        if res["skipped"]:
            n = len(res["skipped"])
            print(f"skipped {n} bad record{'s' if n != 1 else ''} (listed on stderr)")
        return 0
    try:
        res = compare_runs(a.folder, a.out, a.x)
    except OSError as e:
        p.exit(2, f"error: {e}\n")
    print(res["table"])
    print(f"\n{len(res['rows'])} runs: {res['summary']}. " + " ".join(res["notes"]))
    print(f"written: {res['csv']}, {res['md']}, {res['png']}")
    if res["skipped"]:
        print(f"{len(res['skipped'])} results.json not ranked (listed on stderr)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
