"""Training throughput per backend in float32, bf16-mixed and compiled float32: a Markdown table.

The modes of one (model, backend) pair are measured in one process, interleaved: after each mode's
warm-up (which includes compilation), ``rounds`` blocks of ``steps`` timed training steps run in
alternating order (fp32, bf16-mixed, compile, then reversed: :func:`vitzoo.measure.timing.time_fns`)
so that a change in machine load hits every mode alike; a mode's figure is the median over its blocks.
``scripts/precision_table.py`` is the CLI.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from vitzoo.attention import before_train_step
from vitzoo.bench.options import resolve_device
from vitzoo.fileio import atomic_write_text
from vitzoo.measure.timing import time_fns
from vitzoo.models import create_model, model_config
from vitzoo.registry import ConfigError

MODES = ("fp32", "bf16-mixed", "compile")


@dataclass
class PrecisionOptions:
    """What a precision table run depends on.

    Args:
        models: model variants (``vit_cifar``, ``swin_cifar``, ...).
        attention: backends to run (every registered one by default, see ``scripts/precision_table.py``).
        batch: training batch size.
        warmup: untimed steps per mode before the first block (compilation happens here).
        steps: timed training steps per block.
        rounds: blocks per mode (alternating fp32, bf16-mixed, compile).
        model_options: extra options of every model (e.g. ``{"depth": 1}`` for a smoke test).
        compile_backend: ``torch.compile`` backend of the compile mode (``inductor``; ``eager`` in tests).
        seed: torch seed before each model is built.
        device: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``.
    """

    models: list[str] = field(default_factory=lambda: ["vit_cifar", "swin_cifar"])
    attention: list[str] = field(default_factory=list)
    batch: int = 64
    warmup: int = 3
    steps: int = 5
    rounds: int = 3
    model_options: dict[str, Any] = field(default_factory=dict)
    compile_backend: str = "inductor"
    seed: int = 0
    device: str = "auto"

    def __post_init__(self):
        self.device = resolve_device(self.device)
        for name in ("batch", "steps", "rounds"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be at least 1 (got {getattr(self, name)})")
        if self.warmup < 0:
            raise ConfigError(f"--warmup must be at least 0 (got {self.warmup})")


class TrainSteps:
    """Training steps of one model in one mode on a fixed random batch.

    Args:
        model: the classifier (shared by the modes: its weights keep changing, as in training).
        mode: one of :data:`MODES`.
        x, y: the batch.
        compile_backend: backend of ``torch.compile`` (compile mode only).
    """

    def __init__(self, model: nn.Module, mode: str, x: torch.Tensor, y: torch.Tensor, compile_backend: str):
        self.model, self.mode, self.x, self.y = model, mode, x, y
        self.net = torch.compile(model, backend=compile_backend) if mode == "compile" else model
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(self) -> None:
        """One optimizer step: redraw (performer/rfa), forward (autocast in bf16-mixed), backward, update."""
        before_train_step(self.model)
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(self.x.device.type, dtype=torch.bfloat16, enabled=self.mode == "bf16-mixed"):
            loss = nn.functional.cross_entropy(self.net(self.x), self.y)
        loss.backward()
        self.opt.step()


def measure_pair(model_name: str, attention: str, opts: PrecisionOptions) -> dict[str, Any]:
    """Images/s of every mode for one model and backend (``status`` says why a pair could not run).

    Args:
        model_name: model variant.
        attention: backend name.
        opts: the run's options.
    """
    row: dict[str, Any] = {"model": model_name, "attention": attention, "status": "ok"}
    torch.manual_seed(opts.seed)
    try:
        model = create_model(model_name, attention=attention, **opts.model_options).to(opts.device).train()
    except ConfigError as exc:
        return {**row, "status": f"cannot build: {exc}"}
    cfg = model.cfg
    x = torch.randn(opts.batch, cfg.in_chans, cfg.img_size, cfg.img_size, device=opts.device)
    y = torch.randint(0, cfg.num_classes, (opts.batch,), device=opts.device)
    runners = {}
    for mode in MODES:  # a mode that fails (e.g. a compiler error) is reported; the others still run
        try:
            runners[mode] = TrainSteps(model, mode, x, y, opts.compile_backend)
            runners[mode].step()  # the first step compiles
        except Exception as exc:  # noqa: BLE001 - the table names the failure instead of losing the run
            runners.pop(mode, None)
            row[mode] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}"
    if runners:  # alternating blocks (ABBA) of `steps` timed steps after `warmup` untimed ones
        timings = time_fns(
            {m: r.step for m, r in runners.items()},
            torch.device(opts.device),
            warmup=opts.warmup,
            repeats=opts.rounds,
            max_time=0,
            iters=opts.steps,
        )
        row.update({mode: opts.batch / t.median for mode, t in timings.items()})
    return row


def measure(opts: PrecisionOptions, on_row: Optional[Callable[[dict[str, Any]], None]] = None) -> list[dict[str, Any]]:
    """Rows of :func:`measure_pair` for every model and backend of ``opts``.

    Args:
        opts: the run's options (every model name is checked first).
        on_row: called with each row as soon as it is measured (progress output).
    """
    for name in opts.models:
        model_config(name)  # an unknown model is a ConfigError before anything runs
    rows = []
    for name in opts.models:
        for attention in opts.attention:
            rows.append(measure_pair(name, attention, opts))
            if on_row is not None:
                on_row(rows[-1])
    return rows


def _rate(value: Any) -> str:
    """Images/s with one decimal, or the failure text of a mode."""
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def _ratio(value: Any, fp32: Any) -> str:
    """Speed-up over fp32 (blank where either mode failed)."""
    return f"{value / fp32:.2f}" if isinstance(value, float) and isinstance(fp32, float) else ""


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table: images/s per mode and the speed-ups over fp32."""
    lines = [
        "| model | attention | fp32 img/s | bf16-mixed img/s | compile img/s | bf16 × | compile × |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['model']} | {r['attention']} | {r['status']} | | | | |")
            continue
        cells = [_rate(r[m]) for m in MODES] + [_ratio(r[m], r["fp32"]) for m in MODES[1:]]
        lines.append(f"| {r['model']} | {r['attention']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv: Optional[Sequence[str]] = None) -> tuple[PrecisionOptions, str]:
    """The command line as :class:`PrecisionOptions` and the output path of the table.

    Args:
        argv: arguments (default ``sys.argv[1:]``).
    """
    import argparse

    from vitzoo.attention import list_attention

    d = PrecisionOptions()
    split = lambda text: [t for t in text.split(",") if t.strip()]  # noqa: E731
    p = argparse.ArgumentParser(
        description="Training images/s per backend: fp32 vs bf16-mixed vs torch.compile.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--models", type=split, default=d.models, help="comma-separated model variants")
    p.add_argument("--attention", type=split, default=list_attention(), help="comma-separated backends")
    p.add_argument("--batch", type=int, default=d.batch, help="training batch size")
    p.add_argument("--warmup", type=int, default=d.warmup, help="untimed steps per mode (includes compilation)")
    p.add_argument("--steps", type=int, default=d.steps, help="timed steps per block")
    p.add_argument("--rounds", type=int, default=d.rounds, help="alternating blocks per mode")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=d.device)
    p.add_argument("--compile-backend", dest="compile_backend", default=d.compile_backend, help="torch.compile backend")
    p.add_argument("--out", default="precision_table.md", help="Markdown file to write")
    args = vars(p.parse_args(argv))
    out = args.pop("out")
    return PrecisionOptions(**args), out


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Measure every (model, backend) pair, print each row as it comes, write the Markdown table.

    Args:
        argv: command-line arguments (see :func:`parse_args`).
    """
    try:
        opts, out = parse_args(argv)
        rows = measure(opts, on_row=lambda r: print(markdown_table([r]).splitlines()[-1], flush=True))
    except ConfigError as exc:
        print(f"error: {exc}")
        return 2
    atomic_write_text(out, markdown_table(rows))
    print(f"wrote {out}")
    return 0
