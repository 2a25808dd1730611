#!/usr/bin/env python
"""FLOPs you can trust: analytic next to measured multiply-adds (MACs), per module, for vitzoo models.

Examples (from the repository root; arguments are Hydra-style ``key=value`` overrides):

    # one model: module | formula | analytic | measured | difference, plus torch's FlopCounterMode
    python scripts/flops.py model=swin_tiny attention=window
    python scripts/flops.py model=vit_small attention=linformer attention.k=64 depth=1
    python scripts/flops.py model=swin_cifar attention=window model.img_size=40 model.depths=[2,2,2]
    # every model x every attention backend (each backend's configs/attention/<name>.yaml options)
    python scripts/flops.py --all                    # -> outputs/flops/all.md, all.csv
    python scripts/flops.py --all models=vit_tiny,swin_tiny attentions=global,window torch=false
    # GMACs of one attention layer (C=128, 4 heads, no prefix) as the grid grows 8x8 -> 64x64
    python scripts/flops.py --scaling               # -> outputs/flops/scaling.md, .csv, .png
    # every backend's formula with its symbols (Markdown, pasted into docs/flops.md)
    python scripts/flops.py --formulas
    # published GMACs versus vitzoo (and timm with/without vitzoo's SDPA handle)
    python scripts/flops.py --published

Overrides: ``model=<variant>``, ``attention=<backend>``, ``attention.<option>=<value>``,
``model.<field>=<value>`` (also ``img_size=``), ``torch=true|false`` (the second tool, on by
default), ``depth=<n>`` (rows down to this nesting level), ``out=<folder>`` (default
``outputs/flops``), ``models=a,b`` / ``attentions=a,b`` (``--all``), ``grids=8,16,32,64``, ``dim=``,
``heads=``, ``window=`` (``--scaling`` / ``--formulas``). Values are parsed as YAML (``7``,
``true``, ``null``, ``[2,2,6,2]``). Conventions: see ``docs/flops.md`` and :mod:`vitzoo.flops`.
"""
from __future__ import annotations

import csv
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore", category=FutureWarning)  # torch.jit deprecation notices (fvcore traces with it)

import torch  # noqa: E402

import vitzoo  # noqa: E402
from vitzoo.attention import MixerContext, build_attention  # noqa: E402
from vitzoo.flops import (  # noqa: E402
    FlopReport, UnsupportedOpError, count_flops, evaluate_formula, flop_analysis, mixer_flops, torch_flops,
)
from vitzoo.registry import ConfigError  # noqa: E402

CONFIGS = ROOT / "configs"
PUBLISHED = {  # GMACs at 224 px as the papers report them ("FLOPs" there are multiply-adds)
    "vit_tiny": ("DeiT-T", 1.26), "vit_small": ("DeiT-S", 4.6), "vit_base": ("ViT-B/16 (DeiT-B)", 17.6),
    "swin_tiny": ("Swin-T", 4.5), "swin_small": ("Swin-S", 8.7), "swin_base": ("Swin-B", 15.4),
}
TOP_KEYS = {"model", "attention", "img_size", "torch", "depth", "out", "models", "attentions", "grids", "dim",
            "heads", "window"}


# --------------------------------------------------------------------------------------------------
# arguments and configs
# --------------------------------------------------------------------------------------------------

def parse_overrides(args: list[str]) -> tuple[set[str], dict[str, Any]]:
    """``["--all", "model=vit_tiny", "attention.k=64"]`` -> ``({"--all"}, {"model": "vit_tiny", "attention.k": 64})``."""
    flags, values = set(), {}
    for arg in args:
        if arg.startswith("--"):
            flags.add(arg)
            continue
        key, sep, value = arg.lstrip("+").partition("=")
        if not sep or not key:
            raise ConfigError(f"expected key=value, got {arg!r} (e.g. model=swin_tiny attention=window)")
        top = key.split(".", 1)[0]
        if top not in TOP_KEYS or ("." in key and top not in ("model", "attention")):
            raise ConfigError(f"unknown override {key!r}; use one of: {', '.join(sorted(TOP_KEYS))}, "
                              f"attention.<option>, model.<field>")
        values[key] = yaml.safe_load(value) if value else None
    return flags, values


def _names(value: Any) -> Optional[list[str]]:
    if value is None:
        return None
    return [str(v).strip() for v in (value if isinstance(value, list) else str(value).split(",")) if str(v).strip()]


def attention_options(name: str) -> dict[str, Any]:
    """``configs/attention/<name>.yaml`` as a spec (``{"name": ..., **options}``); ``{"name": name}`` if absent."""
    path = CONFIGS / "attention" / f"{name}.yaml"
    spec = yaml.safe_load(path.read_text()) if path.exists() else None
    spec = dict(spec or {})
    spec.pop("defaults", None)
    spec.setdefault("name", name)
    return spec


def attention_spec(values: dict[str, Any], default: str) -> dict[str, Any]:
    """The attention spec from ``attention=`` (its YAML options) and ``attention.<option>=`` overrides."""
    name = values.get("attention") or default
    if name not in vitzoo.list_attention():
        raise ConfigError(f"unknown attention '{name}'; choose attention= one of: {', '.join(vitzoo.list_attention())}")
    spec = attention_options(name)
    spec.update({k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("attention.")})
    return spec


def default_attention(model: str) -> str:
    return vitzoo.models.natural_attention(model)  # the family's own: Swin window, ViT global


def build(model: str, spec: Any, **overrides: Any) -> torch.nn.Module:
    """``create_model`` (raises ConfigError naming the option when the pair cannot be built)."""
    return vitzoo.create_model(model, attention=spec, **overrides)


# --------------------------------------------------------------------------------------------------
# formatting
# --------------------------------------------------------------------------------------------------

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
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def print_table(title: str, header: list[str], rows: list[list[Any]], justify_right: set[int] = frozenset()) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False, header_style="bold")
    for i, h in enumerate(header):
        table.add_column(h, justify="right" if i in justify_right else "left", overflow="fold")
    for row in rows:
        table.add_row(*(str(v) for v in row))
    Console(width=max(160, Console().width)).print(table)


# --------------------------------------------------------------------------------------------------
# modes
# --------------------------------------------------------------------------------------------------

def single(values: dict[str, Any]) -> int:
    """``model=... attention=...``: the per-module table."""
    if not values.get("model"):
        raise ConfigError(f"model= is required; choose one of: {', '.join(vitzoo.list_models())}")
    name = values["model"]
    vitzoo.models.model_config(name)  # unknown model -> ConfigError listing the choices
    spec = attention_spec(values, default_attention(name))
    overrides = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("model.")}
    if values.get("img_size") is not None:
        overrides["img_size"] = values["img_size"]
    second = values.get("torch", True) is not False
    model = build(name, spec, **overrides)
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


ALL_HEADER = ["model", "attention", "status", "params (M)", "analytic GMACs", "measured GMACs", "Δ (MACs)",
              "torch ÷ 2 GMACs", "fvcore matrix-op GMACs", "Δ tools (MACs)", "seconds", "why"]
TORCH_COLUMNS = {"torch ÷ 2 GMACs", "fvcore matrix-op GMACs", "Δ tools (MACs)"}


def all_pairs(values: dict[str, Any]) -> int:
    """``--all``: every model x every backend, Markdown + CSV in ``out`` (the CSV grows row by row)."""
    models = _names(values.get("models")) or vitzoo.list_models()
    attentions = _names(values.get("attentions")) or vitzoo.list_attention()
    second = values.get("torch", True) is not False  # the second tool: ~25 % more time (132 s vs 105 s idle)
    out = Path(values.get("out") or "outputs/flops")
    out.mkdir(parents=True, exist_ok=True)
    header = [h for h in ALL_HEADER if second or h not in TORCH_COLUMNS]
    rows, bad = [], 0
    start = time.time()
    with (out / "all.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for model_name in models:
            for att in attentions:
                t0 = time.time()
                cells = dict(model=model_name, attention=att)
                try:
                    model = build(model_name, attention_options(att))
                    r = count_flops(model, second_tool=second)
                    del model
                except ConfigError as e:
                    cells.update(status="cannot build", why=str(e))
                except UnsupportedOpError as e:
                    cells.update(status="unsupported op", why=str(e))
                except Exception as e:  # noqa: BLE001 - reported, the sweep goes on
                    first = str(e).splitlines()[0] if str(e) else ""
                    cells.update(status="error", why=f"{type(e).__name__}: {first}")
                else:
                    diff = r.measured - r.analytic
                    tools = None if r.torch is None else r.torch - r.matrix
                    cells.update({"status": "ok" if not diff and not tools else "MISMATCH",
                                  "params (M)": f"{r.params / 1e6:.2f}", "analytic GMACs": gmacs(r.analytic),
                                  "measured GMACs": gmacs(r.measured), "Δ (MACs)": signed(diff),
                                  "torch ÷ 2 GMACs": gmacs(r.torch), "fvcore matrix-op GMACs": gmacs(r.matrix),
                                  "Δ tools (MACs)": signed(tools)})
                bad += cells["status"] not in ("ok", "cannot build")
                cells["seconds"] = f"{time.time() - t0:.1f}"
                row = [cells.get(h, "") for h in header]
                rows.append(row)
                writer.writerow(row)
                f.flush()
                print(f"{model_name:>11} {att:<14} {cells['status']:<13} "
                      f"{cells.get('measured GMACs') or cells.get('why', '')}", file=sys.stderr, flush=True)
    note = (" torch ÷ 2 = `torch.utils.flop_counter.FlopCounterMode` FLOPs halved (CPU SDPA formula registered), "
            "compared with fvcore on the ops both count (norms excluded)." if second else "")
    md = ["# FLOPs of every model x attention pair\n",
          f"MACs for one image at each model's own size; measured = fvcore with vitzoo's handles.{note} "
          f"Generated by `python scripts/flops.py --all{'' if second else ' torch=false'}` in "
          f"{time.time() - start:.0f} s.\n",
          "## Measured GMACs\n", pivot(rows, header, models, attentions), "\n## Details\n", markdown(header, rows)]
    (out / "all.md").write_text("\n".join(md))
    built = sum(r[2] in ("ok", "MISMATCH") for r in rows)
    print(f"{built}/{len(rows)} pairs built, {bad} with a mismatch or error; wrote {out / 'all.md'} and "
          f"{out / 'all.csv'} ({time.time() - start:.0f} s)")
    return 1 if bad else 0


def pivot(rows: list[list[Any]], header: list[str], models: list[str], attentions: list[str]) -> str:
    col = header.index("measured GMACs")
    cells = {(r[0], r[1]): (r[col] if r[2] in ("ok", "MISMATCH") else "✗") for r in rows}
    return markdown(["attention"] + models, [[a] + [cells.get((m, a), "") for m in models] for a in attentions]) + \
        "\n✗: not built (the reason is in the details: a ConfigError, an unsupported op or an error).\n"


def _layer(name: str, side: int, dim: int, heads: int, window: int, prefix: int = 0):
    return build_attention(attention_options(name), MixerContext(dim, heads, (side, side), prefix, window=window))


def scaling(values: dict[str, Any]) -> int:
    """``--scaling``: GMACs of one attention layer versus grid side, table + log-log plot."""
    grids = [int(g) for g in (_names(values.get("grids")) or [8, 16, 32, 64])]
    dim, heads, window = int(values.get("dim") or 128), int(values.get("heads") or 4), int(values.get("window") or 8)
    attentions = _names(values.get("attentions")) or vitzoo.list_attention()
    out = Path(values.get("out") or "outputs/flops")
    out.mkdir(parents=True, exist_ok=True)
    series: dict[str, list[Optional[int]]] = {}
    notes: dict[str, str] = {}
    bad = 0
    for name in attentions:
        series[name] = []
        for side in grids:
            try:
                layer = _layer(name, side, dim, heads, window)
                analytic, measured, _ = mixer_flops(layer, (side, side))
            except (ConfigError, UnsupportedOpError) as e:
                series[name].append(None)
                notes[name] = f"{side}x{side}: {e}"
                continue
            bad += analytic != measured
            if analytic != measured:
                notes[name] = f"{side}x{side}: analytic {analytic} != measured {measured}"
            series[name].append(measured)
        print(f"{name:<14} " + " ".join(human(v) for v in series[name]), file=sys.stderr, flush=True)
    header = ["attention"] + [f"{g}x{g} (N={g * g})" for g in grids] + ["exponent", "formula", "note"]
    rows, raw = [], []
    for name, vals in series.items():
        tail = [exponent(grids, vals), _formula(name), notes.get(name, "")]
        rows.append([name] + [gmacs(v, 5) for v in vals] + tail)
        raw.append([name] + ["" if v is None else v for v in vals] + tail)
    write_csv(out / "scaling.csv", header, raw)  # MACs; the Markdown and the console show GMACs
    plot_scaling(out / "scaling.png", grids, series, dim, heads, window)
    intro = (f"GMACs of one attention layer (C={dim}, h={heads}, no prefix token, each backend's "
             f"configs/attention YAML options, natural window {window}) for one image, measured with fvcore "
             f"(equal to the analytic count unless a note says otherwise). Exponent: slope of log MACs "
             f"against log N between the two largest grids (1: linear, 2: quadratic).\n")
    (out / "scaling.md").write_text("# Attention cost versus tokens\n\n" + intro + "\n" + markdown(header, rows)
                                    + f"\n![scaling]({(out / 'scaling.png').name})\n")
    print_table(f"Attention-layer GMACs (C={dim}, h={heads}, window {window}) vs grid", header[:-1],
                [r[:-1] for r in rows], justify_right=set(range(1, len(grids) + 2)))
    print(f"wrote {out / 'scaling.md'}, {out / 'scaling.csv'} and {out / 'scaling.png'}")
    return 1 if bad else 0


def _formula(name: str) -> str:
    from vitzoo.attention import ATTENTION

    return ATTENTION.get(name)[0].formula


def exponent(grids: list[int], vals: list[Optional[int]]) -> str:
    pts = [(g * g, v) for g, v in zip(grids, vals) if v]
    if len(pts) < 2:
        return "—"
    (n0, v0), (n1, v1) = pts[-2], pts[-1]
    return f"{math.log(v1 / v0) / math.log(n1 / n0):.2f}"


def plot_scaling(path: Path, grids: list[int], series: dict[str, list[Optional[int]]], dim: int, heads: int,
                 window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_tok) = plt.subplots(1, 2, figsize=(15, 6.5))
    n = [g * g for g in grids]
    cmap = plt.get_cmap("tab20")
    styles = ["-", "--", "-.", ":"]
    for i, (name, vals) in enumerate(series.items()):
        pts = [(x, v) for x, v in zip(n, vals) if v]
        if not pts:
            continue
        style = dict(marker="o", ms=3, lw=1.4, color=cmap(i % 20), ls=styles[(i // 20) % 4], label=name)
        ax.plot([x for x, _ in pts], [v / 1e9 for _, v in pts], **style)
        ax_tok.plot([x for x, _ in pts], [v / x / 1e3 for x, v in pts], **style)
    firsts = sorted(vals[0] for vals in series.values() if vals and vals[0])
    if firsts:  # guides through the median first point: slope 1 (linear) and slope 2 (quadratic)
        y0 = firsts[len(firsts) // 2] / 1e9
        for slope, label in ((1, "∝ N"), (2, "∝ N²")):
            ax.plot(n, [y0 * (x / n[0]) ** slope for x in n], color="black", lw=1.0, ls=":", zorder=0)
            ax.annotate(label, (n[-1], y0 * (n[-1] / n[0]) ** slope), color="black", fontsize=9,
                        xytext=(4, 0), textcoords="offset points")
    for a in (ax, ax_tok):
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xticks(n, [f"{g}×{g}\nN={g * g}" for g in grids])
        a.set_xlabel("token grid")
        a.grid(True, which="both", alpha=0.3)
    ax.set_ylabel("GMACs per image (one layer)")
    ax.set_title("total: slope 1 = linear, slope 2 = quadratic")
    ax_tok.set_ylabel("KMACs per token")
    ax_tok.set_title("per token: flat = linear (incl. window N·M²), rising = superlinear")
    ax_tok.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    fig.suptitle(f"Attention-layer cost vs tokens (C={dim}, h={heads}, no prefix, natural window {window}; "
                 f"fvcore-measured = analytic)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def formulas(values: dict[str, Any]) -> int:
    """``--formulas``: every backend's formula, symbols and value at a reference layer (Markdown)."""
    side = int(_names(values.get("grids"))[0]) if values.get("grids") else 14
    dim, heads, window = int(values.get("dim") or 128), int(values.get("heads") or 4), int(values.get("window") or 7)
    header = ["attention", "formula (MACs)", f"symbols at {side}×{side}, C={dim}, h={heads}", "flops()",
              "formula value", "linear in N", "flags"]
    rows = []
    for name in (_names(values.get("attentions")) or vitzoo.list_attention()):
        try:
            layer = _layer(name, side, dim, heads, window)
        except ConfigError as e:
            rows.append([f"`{name}`", "", "", "", "", "", f"cannot build: {e}"])
            continue
        grid = (side, side)
        sym = layer.symbols(grid)
        value = evaluate_formula(layer.formula, sym)
        flops = layer.flops(grid)
        mark = "" if value is None else ("= flops()" if round(value) == flops else f"{value / 1e6:.3f} M")
        flags = ", ".join(f for f in ("windowed", "fixed_length", "takes_bias") if getattr(layer, f))
        rows.append([f"`{name}`", f"`{layer.formula}`", ", ".join(f"{k}={v}" for k, v in sym.items()),
                     f"{flops / 1e6:.3f} M", mark or "(not evaluable)", "yes" if layer.linear_cost else "no", flags])
    text = markdown(header, rows)
    print(text)
    return 0


def timm_counts(name: str) -> dict[str, float]:
    """GMACs of a timm ViT (pretrained=False) by fvcore plain / with vitzoo's handles, and by FlopCounterMode."""
    import timm
    from fvcore.nn import FlopCountAnalysis
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = timm.create_model(name, pretrained=False).eval()
    x = torch.zeros(1, 3, 224, 224)
    with torch.no_grad():
        plain = FlopCountAnalysis(model, (x,))
        plain.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
        res = {"fvcore": plain.total(), "fvcore_ops": dict(plain.unsupported_ops()),
               "fvcore + vitzoo handles": flop_analysis(model, (x,)).total()}
        res["FlopCounterMode (CPU)"] = torch_flops(model, (x,), cpu_sdpa=False).total
        res["FlopCounterMode + CPU SDPA formula"] = torch_flops(model, (x,)).total
        with sdpa_kernel(SDPBackend.MATH):
            res["FlopCounterMode, math SDPA"] = torch_flops(model, (x,), cpu_sdpa=False).total
    res["fused_attn"] = bool(getattr(model.blocks[0].attn, "fused_attn", False))
    return res


def published(values: dict[str, Any]) -> int:
    """``--published``: published GMACs versus vitzoo's analytic, fvcore and FlopCounterMode counts."""
    out = Path(values.get("out") or "outputs/flops")
    out.mkdir(parents=True, exist_ok=True)
    header = ["model", "vitzoo", "published GMACs", "analytic", "measured (fvcore)", "Δ measured",
              "torch ÷ 2 (matrix ops)", "fvcore matrix ops", "norms (fvcore only)", "params (M)"]
    rows, bad = [], 0
    for name, (paper, pub) in PUBLISHED.items():
        r = count_flops(build(name, default_attention(name)), second_tool=True)
        rel = (r.measured / 1e9 - pub) / pub
        bad += abs(rel) >= 0.02 or abs(r.analytic / 1e9 - pub) / pub >= 0.02
        rows.append([paper, f"{name}, attention={default_attention(name)}", pub, gmacs(r.analytic, 3),
                     gmacs(r.measured, 3), f"{rel:+.1%}", gmacs(r.torch, 3), gmacs(r.matrix, 3), gmacs(r.norms, 3),
                     f"{r.params / 1e6:.1f}"])
    text = "## Published versus measured (GMACs, 224 px, one image)\n\n" + markdown(header, rows)
    theader = ["timm model (pretrained=False)", "fvcore, no SDPA handle", "fvcore + vitzoo handles",
               "FlopCounterMode ÷ 2, CPU", "FlopCounterMode ÷ 2 + CPU SDPA formula", "FlopCounterMode ÷ 2, math SDPA",
               "fvcore unsupported ops"]
    trows = []
    for name in ("vit_tiny_patch16_224", "vit_small_patch16_224"):
        c = timm_counts(name)
        trows.append([f"{name} (fused_attn={c['fused_attn']})", gmacs(c["fvcore"], 3),
                      gmacs(c["fvcore + vitzoo handles"], 3), gmacs(c["FlopCounterMode (CPU)"], 3),
                      gmacs(c["FlopCounterMode + CPU SDPA formula"], 3), gmacs(c["FlopCounterMode, math SDPA"], 3),
                      ", ".join(f"{k}×{v}" for k, v in sorted(c["fvcore_ops"].items()))])
    text += "\n## timm's fused-attention ViT (GMACs)\n\n" + markdown(theader, trows)
    (out / "published.md").write_text(text)
    print(text)
    return 1 if bad else 0


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0 if argv else 2
    warnings.filterwarnings("ignore")  # torch.jit tracing deprecation / tracer warnings
    try:
        flags, values = parse_overrides(argv)
        unknown = flags - {"--all", "--scaling", "--formulas", "--published"}
        if unknown:
            raise ConfigError(f"unknown flag {sorted(unknown)[0]}; use --all, --scaling, --formulas or --published")
        code = 0
        for flag, fn in (("--formulas", formulas), ("--scaling", scaling), ("--published", published), ("--all", all_pairs)):
            if flag in flags:
                code |= fn(values)
        if not flags:
            code = single(values)
        return code
    except (ConfigError, UnsupportedOpError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
