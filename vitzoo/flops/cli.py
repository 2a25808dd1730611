"""``scripts/flops.py``: analytic next to measured multiply-adds (MACs), per module, for vitzoo models.

Arguments are ``key=value`` overrides (values parsed as YAML: ``7``, ``true``, ``null``,
``[2,2,6,2]``) and the flags ``--all``, ``--scaling``, ``--formulas``, ``--published`` (see
:data:`EPILOG`). Bad input is a one-line ``error: ...`` on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any, Optional

import yaml

import vitzoo
from vitzoo.flops.handles import UnsupportedOpError
from vitzoo.flops.report import FlopReport, count_flops
from vitzoo.flops.specs import build, default_attention, spec_from_overrides
from vitzoo.flops.sweeps import all_pairs, formulas, published, scaling
from vitzoo.flops.tables import gmacs, human, print_table, signed
from vitzoo.registry import ArgumentParser, ConfigError

EPILOG = """examples (from the repository root):
  python scripts/flops.py model=swin_tiny attention=window     # module | formula | analytic | measured | Δ | torch
  python scripts/flops.py model=vit_small attention=linformer attention.k=64 depth=1
  python scripts/flops.py model=swin_cifar attention=window model.img_size=40 model.depths=[2,2,2]
  python scripts/flops.py --all                  # every model x backend -> outputs/flops/all.md, all.csv
  python scripts/flops.py --all models=vit_tiny,swin_tiny attentions=global,window torch=false
  python scripts/flops.py --scaling              # one layer (C=128, 4 heads), 8x8 -> 64x64 -> scaling.md/.csv/.png
  python scripts/flops.py --formulas             # every backend's formula with its symbols (Markdown)
  python scripts/flops.py --published            # published GMACs versus vitzoo (and timm)

overrides: model=<variant>, attention=<backend>, attention.<option>=<value>, model.<field>=<value>
(also img_size=), torch=true|false (the second tool, on by default), depth=<n> (rows down to this
nesting level), out=<folder> (default outputs/flops), models=a,b / attentions=a,b (--all, --scaling,
--formulas), grids=8,16,32,64, dim=, heads=, window= (--scaling / --formulas).
Conventions: docs/flops.md and vitzoo.flops."""
TOP_KEYS = {"model", "attention", "img_size", "torch", "depth", "out", "models", "attentions", "grids", "dim",
            "heads", "window"}
MODES = {"formulas": formulas, "scaling": scaling, "published": published, "all": all_pairs}  # run in this order


def parser() -> ArgumentParser:
    """The command line: the mode flags and the ``key=value`` overrides."""
    p = ArgumentParser(prog="scripts/flops.py", description=__doc__.splitlines()[0].split(": ", 1)[1],
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--all", action="store_true", help="every model x every attention backend (Markdown + CSV)")
    p.add_argument("--scaling", action="store_true", help="one attention layer as the grid grows (table + plot)")
    p.add_argument("--formulas", action="store_true", help="every backend's formula with its symbols (Markdown)")
    p.add_argument("--published", action="store_true", help="published GMACs versus vitzoo's and timm's counts")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides, see below")
    return p


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``["model=vit_tiny", "attention.k=64"]`` -> ``{"model": "vit_tiny", "attention.k": 64}``.

    Args:
        args: ``key=value`` strings; values are parsed as YAML.
    """
    values = {}
    for arg in args:
        key, sep, value = arg.lstrip("+").partition("=")
        if not sep or not key:
            raise ConfigError(f"expected key=value, got {arg!r} (e.g. model=swin_tiny attention=window)")
        top = key.split(".", 1)[0]
        if top not in TOP_KEYS or ("." in key and top not in ("model", "attention")):
            raise ConfigError(f"unknown override {key!r}; use one of: {', '.join(sorted(TOP_KEYS))}, "
                              f"attention.<option>, model.<field>")
        values[key] = yaml.safe_load(value) if value else None
    return values


def single(values: dict[str, Any]) -> int:
    """``model=... attention=...``: the per-module table."""
    if not values.get("model"):
        raise ConfigError(f"model= is required; choose one of: {', '.join(vitzoo.list_models())}")
    name = values["model"]
    if name not in vitzoo.list_models():
        raise ConfigError(f"unknown model '{name}'; choose model= one of: {', '.join(vitzoo.list_models())}")
    spec = spec_from_overrides(values, default_attention(name))
    overrides = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("model.")}
    if values.get("img_size") is not None:
        overrides["img_size"] = values["img_size"]
    second = values.get("torch", True) is not False
    model = build(name, spec, overrides)
    report = count_flops(model, second_tool=second)
    depth = values.get("depth")
    header = ["module", "formula", "analytic", "measured", "Δ (MACs)"]
    if second:
        header += ["torch ÷ 2", "Δ vs fvcore matrix ops"]
    rows = []
    for row in report.modules:
        if depth is not None and row.depth > depth:
            continue
        line = ["  " * row.depth + row.label, row.formula, human(row.analytic), human(row.measured),
                signed(row.measured - row.analytic)]
        if second:
            line += [human(row.torch), signed(None if row.torch is None else row.torch - row.matrix)]
        rows.append(line)
    opts = ", ".join(f"{k}={v}" for k, v in spec.items() if k != "name")
    title = (f"{name} · attention={spec['name']}{' (' + opts + ')' if opts else ''} · {report.img_size}px · "
             f"{report.params / 1e6:.2f}M params · MACs for one image")
    print_table(title, header, rows, justify_right={2, 3, 4, 5, 6})
    print(summary(report))
    return 0 if report.measured == report.analytic else 1


def summary(report: FlopReport) -> str:
    lines = [f"total: analytic {gmacs(report.analytic)} GMACs, measured (fvcore + vitzoo handles) "
             f"{gmacs(report.measured)} GMACs, difference {signed(report.measured - report.analytic)} MACs"]
    if report.torch is not None:
        lines.append(
            f"torch.utils.flop_counter: {gmacs(report.torch)} GMACs (its FLOPs ÷ 2, CPU SDPA formula registered); "
            f"fvcore on the same ops {gmacs(report.matrix)} GMACs (difference {signed(report.torch - report.matrix)}); "
            f"FlopCounterMode does not count norms ({gmacs(report.norms)} GMACs in fvcore's total)")
    if report.unsupported:
        lines.append("ops without a handle (no matrix work, counted 0): "
                     + ", ".join(f"{k}×{v}" for k, v in sorted(report.unsupported.items())))
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    """Run the modes the flags ask for (the per-model table when none); return the exit code.

    Args:
        argv: command-line arguments (default: ``sys.argv[1:]``); none prints the help (exit code 2).
    """
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        parser().print_help()
        return 2
    warnings.filterwarnings("ignore")  # torch.jit tracing deprecation / tracer warnings (fvcore traces)
    try:
        args = parser().parse_intermixed_args(argv)
        values = parse_overrides(args.overrides)
        modes = [fn for flag, fn in MODES.items() if getattr(args, flag)]
        code = 0
        for fn in modes:
            code |= fn(values)
        return code if modes else single(values)
    except (ConfigError, UnsupportedOpError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
