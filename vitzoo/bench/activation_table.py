"""Bytes saved for backward per backend, counted by :class:`~vitzoo.measure.activations.SavedTensorCounter`.

Each (model, backend) pair is built, moved to the meta device and run once in training mode there, with
and without ``model.grad_checkpointing``: the forward allocates nothing, so any grid costs the same few
milliseconds. A backend whose forward cannot run on meta (it reads values: k-means routing, the float64
feature draws of the random-feature backends) runs on CPU instead, and its row says so. On meta, a backend
with CPU kernels runs its portable path, whose saved set may differ from its CPU kernel's; fused attention
runs the kernel CPU would pick (see the counter). ``scripts/memory_table.py`` is the CLI.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import torch

from vitzoo.attention import list_attention
from vitzoo.measure.activations import SavedTensorCounter
from vitzoo.models import create_model, model_config
from vitzoo.registry import ConfigError


@dataclass(frozen=True)
class Row:
    """One (model, backend) pair: where it ran and what it saved, in bytes."""

    model: str
    attention: str
    device: str  # "meta", or "cpu" where the forward needs values
    activations: int  # saved for backward without checkpointing
    checkpointed: int  # with model.grad_checkpointing=true
    buffers: int  # saved storages that are the model's buffers (index tables, features)


def count(model: torch.nn.Module, device: str, batch: int, checkpointing: bool) -> SavedTensorCounter:
    """Run ``model`` once in training mode on ``device`` under the counter.

    Args:
        model: a built model (moved to ``device`` here).
        device: ``"meta"`` or ``"cpu"``.
        batch: images per step.
        checkpointing: ``model.grad_checkpointing``.
    """
    model = model.to(device).train()
    model.set_grad_checkpointing(checkpointing)
    side = model.cfg.img_size
    x = torch.randn(batch, 3, side, side, device=device)
    with SavedTensorCounter(model) as c:
        loss = model(x).sum()  # held until the counter closes: its graph holds what is counted
    del loss
    return c


def measure(name: str, attention: str, grid: int, batch: int) -> Row:
    """The row of one pair at a ``grid × grid`` token grid (the first stage's, for Swin).

    Args:
        name: model variant.
        attention: backend name.
        grid: tokens per side of the grid the patch embedding makes.
        batch: images per step.
    """
    img_size = grid * model_config(name).patch_size
    torch.manual_seed(0)
    model = create_model(name, attention=attention, img_size=img_size)
    for device in ("meta", "cpu"):
        try:
            plain = count(model, device, batch, False)
            checkpointed = count(model, device, batch, True)
        except (RuntimeError, NotImplementedError):
            if device == "cpu":
                raise
            torch.manual_seed(0)
            model = create_model(name, attention=attention, img_size=img_size)  # meta left it without values
            continue
        return Row(name, attention, device, plain.activation_bytes, checkpointed.activation_bytes, plain.buffer_bytes)
    raise AssertionError("unreachable")


def markdown(rows: Sequence[Row], grid: int, batch: int, notes: Sequence[str] = ()) -> str:
    """The table, with a line saying what it counts and ``notes`` (pairs that do not build) under it."""
    lines = [
        f"Bytes autograd saves for backward, one training forward at a {grid}x{grid} token grid, batch {batch} "
        "(vitzoo.measure.activations; parameters left out):",
        "",
        "| model | backend | device | activations | with grad_checkpointing | cut | buffers |",
        "|---|---|---|--:|--:|--:|--:|",
    ]
    for r in rows:
        cut = r.activations / r.checkpointed if r.checkpointed else float("inf")
        lines.append(f"| {r.model} | {r.attention} | {r.device} | {r.activations:,} | {r.checkpointed:,} | "
                     f"{cut:.1f}× | {r.buffers:,} |")
    return "\n".join(lines + ([""] if notes else []) + [f"- {n}" for n in notes])


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI: print the Markdown table (``scripts/memory_table.py --help``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vit_cifar", help="comma-separated model variants")
    parser.add_argument("--attention", default="", help="comma-separated backends (default: every one)")
    parser.add_argument("--grid", type=int, default=8, help="tokens per side of the patch grid (8: 64 tokens)")
    parser.add_argument("--batch", type=int, default=1, help="images per step")
    args = parser.parse_args(argv)
    if args.grid < 1 or args.batch < 1:
        raise ConfigError(f"--grid and --batch must be at least 1 (got {args.grid}, {args.batch})")
    names = [a for a in args.attention.split(",") if a] or list_attention()
    rows, notes = [], []
    for model in [m for m in args.models.split(",") if m]:
        for attention in names:
            try:
                rows.append(measure(model, attention, args.grid, args.batch))
            except ConfigError as e:  # the backend's options do not fit this grid (Swin's small last stages)
                notes.append(f"{model} + {attention}: {e}")
    print(markdown(rows, args.grid, args.batch, notes))
    return 0
