"""Shared by training and evaluation: results file, error lines, FLOPs table, inference timing."""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import sys
import traceback
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional

import torch
from omegaconf import DictConfig
from pytorch_lightning.utilities.rank_zero import rank_zero_only
from rich.console import Console
from rich.table import Table
from torch import nn

from vitzoo.fileio import atomic_write_text
from vitzoo.flops import FlopReport
from vitzoo.measure.timing import time_fns
from vitzoo.registry import ConfigError, build_config

RESULT_KEYS = (
    "status",
    "model",
    "attention",
    "data",
    "best_val_acc",
    "best_val_acc5",
    "val_loss",
    "train_images_per_s",
    "infer_images_per_s",
    "peak_memory_mb",
    "params",
    "gmacs",
    "gmacs_analytic",
    "epochs",
    "val_images",
    "best_ckpt",
    "export_dir",
    "error",
)

console = Console()


class ResultsFile:
    """``results.json`` of one run (the contract ``scripts/compare.py`` reads). Only rank 0 writes.

    Args:
        path: where to write.
        **fields: initial values; every key of :data:`RESULT_KEYS` is present (None until known).
    """

    def __init__(self, path: Path, **fields: Any):
        self.path = Path(path)
        self.data: dict[str, Any] = {k: None for k in RESULT_KEYS}
        self.update(**fields)

    def update(self, **fields: Any) -> dict[str, Any]:
        self.data.update(fields)
        if rank_zero_only.rank == 0:
            make_run_folder(self.path.parent)
            atomic_write_text(self.path, json.dumps(self.data, indent=2) + "\n")  # atomic, never through a symlink
        return self.data


def make_run_folder(folder: Path) -> Path:
    """Create the run folder (and its parents); one line naming it when that is impossible.

    Args:
        folder: ``hydra.run.dir`` / ``paths.output_dir``.
    """
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"cannot create the run folder {folder} ({e.strerror or type(e).__name__}); "
            f"choose another with hydra.run.dir=<folder>"
        ) from None
    return Path(folder)


def unwrap_worker_error(exc: BaseException) -> BaseException:
    """A DataLoader worker's error as it was raised in the worker (PyTorch re-raises it in the main process as
    ``Caught ConfigError in DataLoader worker process 0.`` followed by the worker's traceback).

    Args:
        exc: any exception; returned unchanged unless it is such a re-raised worker error.
    """
    text = str(exc)
    if not (text.startswith("Caught ") and "DataLoader worker" in text.split("\n", 1)[0] and "\n" in text):
        return exc
    last = [ln for ln in text.splitlines() if ln.strip()][-1]
    name = type(exc).__name__
    message = last.split(f"{name}: ", 1)[1] if f"{name}: " in last else last
    try:
        return type(exc)(message)
    except Exception:  # an exception type that needs other arguments: keep the original
        return exc


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (a DataLoader worker's own message for errors raised in a
    worker); the type name too unless it is a ConfigError."""
    exc = unwrap_worker_error(exc)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, ConfigError):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def write_traceback(exc: BaseException, folder: Path) -> Optional[Path]:
    """Save the full traceback of an unexpected error beside the run's results (rank 0)."""
    if rank_zero_only.rank != 0:
        return None
    path = Path(folder) / "traceback.txt"
    try:
        make_run_folder(path.parent)
        return atomic_write_text(path, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    except (OSError, ConfigError):
        return None  # the one-line error is still printed


def run_entry(task: Callable[[DictConfig], Any], cfg: DictConfig) -> Any:
    """Call ``task(cfg)`` from a ``@hydra.main`` entry point with user-facing error handling.

    Single run: any error becomes a one-line message and exit status 1 (the traceback of an
    unexpected error is in the run folder's ``traceback.txt``; ``HYDRA_FULL_ERROR=1`` re-raises).
    Multirun: the failure is recorded in the job's ``results.json`` and the sweep continues.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    try:
        return task(cfg)
    except Exception as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        hydra = HydraConfig.get() if HydraConfig.initialized() else None
        message = f"error: {one_line(e)}"
        if not isinstance(e, ConfigError) and hydra is not None:
            message += f" (traceback: {Path(hydra.runtime.output_dir) / 'traceback.txt'})"
        if hydra is not None and hydra.mode == RunMode.MULTIRUN:
            print(message, file=sys.stderr)
            return None
        raise SystemExit(message) from None


def read_checkpoint(path: Any) -> dict[str, Any]:
    """Load a vitzoo training checkpoint (CPU, ``weights_only``),
    or raise a one-line ConfigError naming ``ckpt_path``."""
    if path is None or str(path) in ("", "???"):
        raise ConfigError("ckpt_path is required: python eval.py ckpt_path=<run>/checkpoints/<file>.ckpt")
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise ConfigError(
            f"ckpt_path={p} does not exist" + (" (it is a folder; give a .ckpt file)" if p.is_dir() else "")
        )
    try:
        ckpt = torch.load(p, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, zipfile.BadZipFile, EOFError, ValueError, OSError) as e:
        raise ConfigError(f"ckpt_path={p} is not a checkpoint ({type(e).__name__})") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "model" not in ckpt.get("hyper_parameters", {}):
        raise ConfigError(f"ckpt_path={p} is not a vitzoo training checkpoint (no state_dict/hyper_parameters.model)")
    return ckpt


def flops_table(report: FlopReport, title: str) -> Table:
    """Rich table: params, then analytic and fvcore-measured GMACs for the model and every attention layer."""
    table = Table(
        title=f"{title}: {report.params / 1e6:.3f} M params, {report.measured / 1e9:.4f} GMACs measured, "
        f"{report.analytic / 1e9:.4f} GMACs analytic (one image)"
    )
    table.add_column("layer")
    table.add_column("formula")
    table.add_column("analytic GMACs", justify="right")
    table.add_column("measured GMACs", justify="right")
    table.add_column("match")
    for name, formula, analytic, measured in report.rows():
        table.add_row(
            name, formula, f"{analytic / 1e9:.5f}", f"{measured / 1e9:.5f}", "yes" if analytic == measured else "NO"
        )
    return table


@torch.inference_mode()
def inference_throughput(
    model: nn.Module,
    batch_size: int = 64,
    img_size: Optional[int] = None,
    warmup: int = 3,
    steps: int = 10,
    device: Optional[torch.device] = None,
    context: Callable[[], ContextManager] = contextlib.nullcontext,
) -> float:
    """Images/s of ``model`` in eval mode at a fixed batch of random images: one block of ``steps`` forward passes
    timed by :func:`vitzoo.measure.timing.time_fns` after the untimed warm-up.

    Args:
        model: a vitzoo backbone (moved to ``device`` and left there).
        batch_size: images per forward pass.
        img_size: input side (default: the model's).
        warmup, steps: untimed (at least one) and timed forward passes.
        device: where to run (default: the model's device).
        context: wraps the forward passes, e.g. the Trainer precision plugin's autocast.
    """
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.to(device)
    s = img_size or model.cfg.img_size
    x = torch.randn(batch_size, model.cfg.in_chans, s, s, device=device)
    was = model.training
    model.eval()
    try:
        with context():
            timing = time_fns({"forward": lambda: model(x)}, device, warmup=warmup, repeats=1, max_time=0,
                              iters=steps)["forward"]
        return batch_size / timing.median
    finally:
        model.train(was)


@dataclass
class BenchmarkConfig:
    """The ``benchmark`` options: inference throughput measured after training / in eval (eval mode, random images)."""

    batch_size: int = 64  # images per forward pass
    warmup: int = 3  # untimed passes (at least one runs)
    steps: int = 10  # timed passes


def benchmark_config(options: Any) -> BenchmarkConfig:
    """Validate the ``benchmark`` config (None: the defaults; an unknown key is a ConfigError naming it)."""
    return build_config(BenchmarkConfig, options or {}, "benchmark")


def trainer_throughput(trainer: Any, model: nn.Module, bench: BenchmarkConfig) -> float:
    """:func:`inference_throughput` on the Trainer's device and precision, sized by the ``benchmark`` config."""
    return inference_throughput(
        model,
        batch_size=bench.batch_size,
        warmup=bench.warmup,
        steps=bench.steps,
        device=trainer.strategy.root_device,
        context=trainer.precision_plugin.forward_context,
    )
