"""Result records: the small JSON file a finished run leaves in a folder that is committed to git.

A sweep that needs many hours writes one record per finished job to
``<record_dir>/<model>/<attention>/seed<k>.json`` (``<model>`` is the variant, ``vit_cifar+tome`` where the model
reduces tokens, see :func:`model_label`); re-running it skips every job whose record exists, so it
survives stops and machine changes, and a newly registered backend costs only its own job. Checkpoints stay in
the run folder (out of git). ``scripts/compare.py <record_dir>`` turns the records into tables and a chart.
"""
from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from vitzoo.bench.environment import cpu_model, git_commit
from vitzoo.registry import ConfigError

RECORD_VERSION = 1  # bump when a field changes meaning


def record_path(record_dir: Any, model: str, attention: str, seed: int) -> Path:
    """Where the record of one (model, attention, seed) job lives.

    Args:
        record_dir: the sweep's record folder (``record_dir`` in the run config).
        model: model variant name.
        attention: attention backend name.
        seed: the run's seed.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"seed must be an integer to name a record (got {seed!r})")
    return Path(str(record_dir)) / str(model) / str(attention) / f"seed{seed}.json"


def model_label(model: Mapping[str, Any]) -> str:
    """The model part of a record: the variant name, joined with ``+<reducer>`` where the model reduces tokens
    (``vit_cifar+tome``), so a run with token reduction never takes the record of the same backend without it.

    Args:
        model: the run's resolved ``model`` config (``name`` and, optionally, ``token_reduction``: a reducer name
            or a mapping with ``name``).
    """
    reduction = model.get("token_reduction")
    if isinstance(reduction, Mapping):
        reduction = reduction.get("name")
    return f"{model['name']}+{reduction}" if reduction else str(model["name"])


def wilson_interval(accuracy: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95 % Wilson score interval of an accuracy measured on ``n`` images (the sampling interval of the
    validation set, not the seed-to-seed spread).

    Args:
        accuracy: fraction correct in [0, 1].
        n: number of validation images.
        z: normal quantile (1.96 for 95 %).
    """
    if n <= 0:
        return (math.nan, math.nan)
    centre = (accuracy + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(accuracy * (1 - accuracy) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def build_record(results: Mapping[str, Any], run: Mapping[str, Any]) -> dict[str, Any]:
    """The record of a finished run.

    Args:
        results: the run's final ``results.json`` content (accuracy, steps, wall time, ...).
        run: the resolved run config (model, attention, data, trainer, optim, seed, ...).
    """
    data, trainer = run.get("data") or {}, run.get("trainer") or {}
    acc, n_val = results.get("best_val_acc"), results.get("val_images")
    low, high = wilson_interval(float(acc), int(n_val)) if acc is not None and n_val else (None, None)
    batch = int(data.get("batch_size") or 0)
    return {
        "version": RECORD_VERSION,
        "model": model_label(run["model"]), "attention": run["attention"]["name"], "seed": run.get("seed"),
        "data": data.get("name"), "img_size": run["model"].get("img_size"),
        "experiment": run.get("task_name"),
        "top1": acc, "top1_ci95": [low, high], "top5": results.get("best_val_acc5"), "loss": results.get("val_loss"),
        "val_images": n_val, "epochs": results.get("epochs"), "steps": results.get("steps"),
        "images_seen": (results.get("steps") or 0) * batch, "batch_size": batch,
        "precision": str(trainer.get("precision")), "wall_s": results.get("wall_s"),
        "lr": (run.get("optim") or {}).get("lr"), "policy": data.get("policy"),
        "commit": git_commit(), "cpu": cpu_model(), "torch": torch.__version__, "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }


def write_record(path: Path, record: Mapping[str, Any]) -> Path:
    """Write ``record`` to ``path`` atomically, never through a symbolic link.

    Args:
        path: the record file (its folders are created).
        record: JSON-serialisable content.
    """
    path = Path(path)
    if path.is_symlink():
        raise ConfigError(f"record_dir: {path} is a symbolic link; remove it or choose another record_dir")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)  # a reader never sees half a record
    return path


def read_records(folder: Any) -> list[dict[str, Any]]:
    """Every record under ``folder`` (recursively), each with ``path`` set to its file relative to ``folder``.

    Args:
        folder: a record folder such as ``results/cifar10``.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder of result records")
    out = []
    for p in sorted(folder.rglob("seed*.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{p}: not a readable result record ({type(exc).__name__})") from None
        if isinstance(rec, dict) and rec.get("version") == RECORD_VERSION:
            out.append({**rec, "path": str(p.relative_to(folder))})
    return out


def existing_record(record_dir: Optional[Any], run: Mapping[str, Any]) -> Optional[Path]:
    """The record file of this run if ``record_dir`` is set and the record exists, else ``None``."""
    if not record_dir:
        return None
    path = record_path(record_dir, model_label(run["model"]), run["attention"]["name"], run.get("seed"))
    return path if path.is_file() else None
