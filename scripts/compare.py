#!/usr/bin/env python
"""Accuracy versus throughput of a Hydra multirun: table sorted by accuracy and a bubble chart.

    python scripts/compare.py multirun/zoo_digits/<date>/<time>
    python scripts/compare.py multirun/zoo_digits/<date>/<time> --x infer --out docs/img
    python scripts/compare.py --sweep-command zoo_cifar10      # the sweep with every backend spelled out

Each job folder's ``results.json`` (written by ``train.py``) gives best validation accuracy,
training and inference throughput, peak memory, parameters and GMACs. A job that failed, is still
``running`` or has no ``results.json`` is listed as such (its backend read from
``.hydra/hydra.yaml`` / ``.hydra/overrides.yaml``), never dropped. Writes ``runs.csv``,
``runs.md`` and ``accuracy_vs_throughput.png`` (x throughput, y accuracy, bubble area peak
memory, one labelled bubble per run, Pareto front dashed) to ``<folder>/compare/`` (``--out``).
"""
from __future__ import annotations

import argparse
import sys

from vitzoo.bench.compare import compare_runs, sweep_command


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", nargs="?", help="multirun folder (multirun/<task>/<date>/<time>) or any folder above jobs")
    p.add_argument("--out", default=None, help="output folder (default: <folder>/compare)")
    p.add_argument("--x", choices=["train", "infer"], default="train", help="throughput on the x axis")
    p.add_argument("--sweep-command", metavar="EXPERIMENT", nargs="?", const="zoo_digits", default=None,
                   help="print the multirun command for EXPERIMENT with every registered backend listed, and exit")
    a = p.parse_args(argv)
    if a.sweep_command:
        print(sweep_command(a.sweep_command))
        return 0
    if not a.folder:
        p.error("give the multirun folder (or --sweep-command)")
    res = compare_runs(a.folder, a.out, a.x)
    print(res["table"])
    print(f"\n{len(res['rows'])} runs: {res['summary']}. " + " ".join(res["notes"]))
    print(f"written: {res['csv']}, {res['md']}, {res['png']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
