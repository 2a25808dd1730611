"""``scripts/plan.py``: will a training run fit, with which batch, and how long will an epoch take.

Arguments are Hydra overrides of the train config (``model=vit_base attention=local model.img_size=1024
data.batch_size=64``, composed as ``vitzoo-train`` composes them) and the flags of :func:`parser`. Nothing
is allocated for the model: it is built and counted on the meta device (:mod:`vitzoo.bench.plan`). Bad
input is a one-line ``error: ...`` on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import csv
import sys
from typing import Any, Optional

from vitzoo.bench.plan import (
    ASSUMED_UTILISATION,
    DEVICES,
    OPTIMIZER_BYTES,
    Footprint,
    device,
    footprint,
    images_per_second,
    largest_batch,
    peak_bytes,
)
from vitzoo.registry import ArgumentParser, ConfigError

EPILOG = """examples (from the repository root):
  python scripts/plan.py model=vit_base attention=local model.img_size=1024 data.batch_size=64 --device h100-80gb
  python scripts/plan.py model=vit_base model.img_size=1024 --all             # every backend, one line each
  python scripts/plan.py model=swin_tiny --all --csv --device a100-40gb      # the same as CSV
The peak is a model (parameters, gradients, AdamW state, saved activations, a transient allowance);
images/s assume a utilisation of the device's matmul peak (--utilisation)."""
IMAGENET_TRAIN = 1_281_167  # ImageNet-1k training images: the default epoch at 224 px and above
CIFAR_TRAIN = 50_000  # CIFAR training images: the default epoch below 224 px


def parser() -> ArgumentParser:
    """The command line: flags and the train config's ``key=value`` overrides."""
    p = ArgumentParser(prog="scripts/plan.py", description=__doc__.splitlines()[0].split(": ", 1)[1],
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="h100-80gb", help=f"one of: {', '.join(DEVICES)} (default h100-80gb)")
    p.add_argument("--all", action="store_true", help="one line per registered attention backend")
    p.add_argument("--csv", action="store_true", help="with --all: CSV instead of a Markdown table")
    p.add_argument("--attentions", default=None, help="with --all: these backends only (comma-separated)")
    p.add_argument("--epoch-images", type=int, default=None,
                   help=f"images per epoch (default {IMAGENET_TRAIN:,} at img_size >= 224, else {CIFAR_TRAIN:,})")
    p.add_argument("--utilisation", type=float, default=ASSUMED_UTILISATION,
                   help=f"assumed fraction of the matmul peak reached (default {ASSUMED_UTILISATION})")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="train config overrides (Hydra)")
    return p


GROUPS = ("model", "attention", "data", "trainer", "experiment")  # config groups whose option names are checked
IGNORED = ("optim", "benchmark")  # sections that do not change the plan (AdamW is assumed): left out of the config


def hydra_overrides(overrides: list[str]) -> list[str]:
    """The overrides as Hydra composes them for the planner: ``optim``/``benchmark`` dropped (with their
    defaults, so :mod:`vitzoo.training` and Lightning need not be imported), ``model.<field>=`` of any model
    config field written ``++model.<field>=``, and a ``group=option`` naming no option refused in one line.

    Args:
        overrides: Hydra overrides, e.g. ``["model=vit_base", "model.img_size=1024"]``.
    """
    from vitzoo.configs import CONFIG_DIR
    from vitzoo.models.factory import model_fields

    fields, out = set(model_fields()), []
    for arg in overrides:
        key, sep, value = arg.partition("=")
        bare = key.lstrip("+~")
        if not sep:
            raise ConfigError(f"expected key=value, got {arg!r} (e.g. model=vit_base)")
        if bare.split(".")[0] in IGNORED:
            continue
        if bare in GROUPS and value not in (choices := sorted(f.stem for f in (CONFIG_DIR / bare).glob("*.yaml"))):
            raise ConfigError(f"unknown {bare} '{value}'; choose {bare}= one of: {', '.join(choices)}")
        parts = bare.split(".")
        out.append(f"++{bare}={value}" if len(parts) == 2 and parts[0] == "model" and parts[1] in fields else arg)
    return [*out, *(f"~{section}" for section in IGNORED)]


def compose(overrides: list[str]) -> dict[str, Any]:
    """The ``model``, ``attention``, ``data`` and ``trainer.precision`` of the train config ``vitzoo-train
    <overrides>`` runs with, resolved (see :func:`hydra_overrides`; a bad option is a one-line ConfigError).

    Args:
        overrides: Hydra overrides, e.g. ``["model=vit_base", "model.img_size=1024"]``.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from vitzoo.configs import CONFIG_DIR

    args = hydra_overrides(overrides)
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3", job_name="plan"):
            cfg = hydra_compose("train", overrides=args)
        out = {k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("model", "attention", "data")}
    except Exception as e:  # noqa: BLE001 - Hydra's multi-line errors become one line
        raise ConfigError(str(e).strip().splitlines()[0]) from None
    return {**out, "trainer": {"precision": cfg.trainer.get("precision")}}


def model_parts(cfg: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``(variant, attention config, model options)`` of a composed config (pretrained weights are not loaded)."""
    options = dict(cfg["model"])
    name = options.pop("name")
    options.pop("pretrained", None)
    if options.get("num_classes") is None:
        options["num_classes"] = cfg["data"]["num_classes"]
    return name, dict(cfg["attention"]), options


def matmul_dtype(cfg: dict[str, Any]) -> str:
    """``bf16`` for a bf16/fp16 mixed-precision trainer, else ``fp32``."""
    from vitzoo.flops.mfu import precision_dtype

    return precision_dtype(cfg["trainer"].get("precision"))


def gib(n: float) -> str:
    """Bytes as GiB (MiB below one GiB)."""
    return f"{n / 2**30:,.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:,.1f} MiB"


def report(fp: Footprint, batch: int, dev_name: str, precision: str, epoch: int, utilisation: float) -> list[str]:
    """The planner's answer for one model, batch and device, as lines of text.

    Args:
        fp: the model's footprint.
        batch: ``data.batch_size``.
        dev_name: a key of :data:`DEVICES`.
        precision: ``trainer.precision`` (``bf16-mixed`` uses the bf16 peak).
        epoch: images per epoch.
        utilisation: the assumed fraction of the matmul peak.
    """
    from vitzoo.flops.mfu import precision_dtype

    dtype = precision_dtype(precision)
    dev = device(dev_name)
    lines = [f"plan: {fp.label} · {fp.params / 1e6:.2f}M parameters · {fp.macs / 1e9:.2f} GMACs per image "
             f"(analytic) · built with {fp.build} (no weight storage)"]
    if fp.proxy:
        lines.append(f"  activations counted on a stand-in: {fp.proxy}")
    for ckpt in (False, True):
        act = fp.activations(ckpt)
        lines.append(f"  saved activations{' with grad_checkpointing' if ckpt else ''}: {gib(act.per_image)} per "
                     f"image + {gib(act.fixed)} fixed (SavedTensorCounter on meta, float32, batch 2 minus batch 1); "
                     f"transient allowance {gib(act.transient_per_image)} per image")
    lines.append(f"  peak model = {OPTIMIZER_BYTES} B/param (fp32 weights, grads, AdamW moments) "
                 f"{gib(OPTIMIZER_BYTES * fp.params)} + activations(batch) + transient (largest saved tensor of a "
                 f"block; with checkpointing plus one block's saved set); a lower bound: no allocator cache, "
                 f"CUDA context or gradient buffers of backward")
    lines.append(f"  device {dev_name}: {gib(dev.memory)} ({dev.source})")
    for ckpt in (False, True):
        peak = peak_bytes(fp, batch, ckpt)
        verdict = "fits" if peak <= dev.memory else "does not fit"
        lines.append(f"  batch {batch}{' with grad_checkpointing' if ckpt else ''}: peak {gib(peak)} -> {verdict}; "
                     f"largest batch that fits: {largest_batch(fp, dev.memory, ckpt)}")
    if peak_bytes(fp, batch) > dev.memory and peak_bytes(fp, batch, True) <= dev.memory:
        lines.append("  suggestion: model.grad_checkpointing=true (about one more forward per step)")
    rate = images_per_second(fp.macs, dev, dtype, utilisation)
    hours = epoch / rate / 3600 if rate else float("inf")
    lines.append(f"  time (trainer.precision {precision}: {dtype} peak {dev_peak(dev, dtype) / 1e9:,.0f} GMACs/s, "
                 f"ASSUMED utilisation {utilisation:.0%}, training = 3 forwards): {rate:,.1f} images/s, "
                 f"{hours:,.3g} h per epoch of {epoch:,} images (grad_checkpointing adds about a third)")
    if dtype == "fp32" and dev_name != "cpu-2core":
        lines.append("  trainer=gpu (bf16-mixed) plans with the bf16 peak; autocast is not applied on meta, so the "
                     "activation figures stay float32 (an upper bound under bf16-mixed)")
    return lines


def dev_peak(dev: Any, dtype: str) -> float:
    return dev.peak_bf16 if dtype in ("bf16", "fp16") else dev.peak_fp32


COLUMNS = ["attention", "params_m", "gmacs", "act_gib_per_image", "act_ckpt_gib_per_image", "peak_gib",
           "fits", "max_batch", "max_batch_ckpt", "images_per_s", "hours_per_epoch", "note"]


def all_rows(overrides: list[str], dev_name: str, epoch: Optional[int], utilisation: float,
             backends: Optional[list[str]] = None) -> list[dict[str, Any]]:
    """One row per backend: the same overrides with ``attention=<backend>`` (its YAML's options).

    Args:
        overrides: Hydra overrides; ``attention=`` and ``attention.*`` among them are left out.
        dev_name: a key of :data:`DEVICES`.
        epoch: images per epoch (None: :func:`default_epoch`).
        utilisation: the assumed fraction of the matmul peak.
        backends: the backends (None: every registered one).
    """
    from vitzoo.attention import list_attention
    from vitzoo.configs import attention_options

    known = list_attention()
    for backend in backends or []:
        if backend not in known:
            raise ConfigError(f"--attentions: unknown backend {backend!r}; choose from: {', '.join(known)}")
    dev, rows = device(dev_name), []
    cfg = compose([o for o in overrides if not o.startswith(("attention=", "attention."))])
    name, _, options = model_parts(cfg)
    for backend in backends or known:
        row: dict[str, Any] = dict.fromkeys(COLUMNS, "")
        row["attention"] = backend
        try:  # attention=<backend> composes its YAML's options
            fp = footprint(name, attention_options(backend), options, proxy=True)
        except (ConfigError, RuntimeError, NotImplementedError, ValueError) as e:
            row["note"] = f"not counted on meta: {str(e).splitlines()[0][:100]}"
            rows.append(row)
            continue
        batch = int(cfg["data"]["batch_size"])
        rate = images_per_second(fp.macs, dev, matmul_dtype(cfg), utilisation)
        images = epoch or default_epoch(options)
        row.update(params_m=round(fp.params / 1e6, 2), gmacs=round(fp.macs / 1e9, 2),
                   act_gib_per_image=round(fp.plain.per_image / 2**30, 3),
                   act_ckpt_gib_per_image=round(fp.checkpointed.per_image / 2**30, 3),
                   peak_gib=round(peak_bytes(fp, batch) / 2**30, 2), fits=peak_bytes(fp, batch) <= dev.memory,
                   max_batch=largest_batch(fp, dev.memory), max_batch_ckpt=largest_batch(fp, dev.memory, True),
                   images_per_s=round(rate, 1), hours_per_epoch=round(images / rate / 3600, 2) if rate else "",
                   note=f"batch {batch}; stand-in {fp.proxy}" if fp.proxy else f"batch {batch}")
        rows.append(row)
    return rows


def default_epoch(options: dict[str, Any]) -> int:
    """ImageNet-1k's training images at ``img_size`` 224 and above, CIFAR's below."""
    return IMAGENET_TRAIN if int(options.get("img_size", 224)) >= 224 else CIFAR_TRAIN


def print_rows(rows: list[dict[str, Any]], as_csv: bool) -> None:
    if as_csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in COLUMNS) + " |")


def main(argv: Optional[list[str]] = None) -> int:
    """Plan one run (or every backend with ``--all``); return the exit code.

    Args:
        argv: command-line arguments (default: ``sys.argv[1:]``).
    """
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parser().parse_intermixed_args(argv)
        device(args.device)
        if not 0 < args.utilisation <= 1:
            raise ConfigError(f"--utilisation must be in (0, 1] (got {args.utilisation})")
        if args.epoch_images is not None and args.epoch_images <= 0:
            raise ConfigError(f"--epoch-images must be positive (got {args.epoch_images})")
        if args.all:
            backends = [b.strip() for b in args.attentions.split(",") if b.strip()] if args.attentions else None
            rows = all_rows(args.overrides, args.device, args.epoch_images, args.utilisation, backends)
            if not args.csv:
                print(f"plan --all on {args.device} · peak model in GiB · images/s at an ASSUMED utilisation of "
                      f"{args.utilisation:.0%} · activations counted on meta")
            print_rows(rows, args.csv)
            return 0
        cfg = compose(args.overrides)
        name, attention, options = model_parts(cfg)
        fp = footprint(name, attention, options)
        epoch = args.epoch_images or default_epoch(options)
        print("\n".join(report(fp, int(cfg["data"]["batch_size"]), args.device, cfg["trainer"].get("precision"), epoch,
                               args.utilisation)))
        return 0
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
