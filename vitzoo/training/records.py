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
import platform
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Optional

import torch

from vitzoo.attention import list_attention
from vitzoo.fileio import atomic_write_text, read_regular_text
from vitzoo.layers.token_reduction import REDUCTIONS
from vitzoo.measure.environment import cpu_model, git_commit
from vitzoo.models import list_models
from vitzoo.registry import ConfigError

RECORD_VERSION = 1  # bump when a field changes meaning
RECORD_MAX_BYTES = 1 << 20  # a record is a few hundred bytes; a larger file is not read
TEXT = re.compile(r"[A-Za-z0-9 ._,:;()+\-/@#=%]{0,200}")  # free text of a record: no markup, no line breaks


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


def build_record(results: Mapping[str, Any], run: Mapping[str, Any], command: Optional[str] = None) -> dict[str, Any]:
    """The record of a finished run.

    Args:
        results: the run's final ``results.json`` content (accuracy, steps, wall time, ...).
        run: the resolved run config (model, attention, data, trainer, optim, seed, ...).
        command: the command line that re-runs this job alone (``python train.py`` and its overrides).
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
        "top1_tta": results.get("best_val_acc_tta"),
        "top1_per_epoch": results.get("val_acc_per_epoch"),
        "val_images": n_val, "epochs": results.get("epochs"), "steps": results.get("steps"),
        "images_seen": (results.get("steps") or 0) * batch, "batch_size": batch,
        "precision": str(trainer.get("precision")), "wall_s": results.get("wall_s"),
        "lr": (run.get("optim") or {}).get("lr"), "policy": data.get("policy"),
        "commit": results.get("commit") or git_commit(), "cpu": cpu_model(), "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "command": command,
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
    return atomic_write_text(path, json.dumps(record, indent=2) + "\n")  # a reader never sees half a record


def check_record_dir(record_dir: Any) -> Path:
    """Make sure records can be written under ``record_dir`` before anything trains: the folder is created and a
    probe file written and removed there; otherwise one line naming the folder.

    Args:
        record_dir: the sweep's record folder (``record_dir`` in the run config).
    """
    folder = Path(str(record_dir))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / ".write-test", "").unlink()
    except OSError as e:
        raise ConfigError(f"record_dir={record_dir} is not writable ({e.strerror or type(e).__name__}); "
                          f"choose a folder this user can write") from None
    return folder


def save_record(record_dir: Any, results: Mapping[str, Any], run: Mapping[str, Any], results_path: Path,
                command: Optional[str] = None) -> Path:
    """Write the record of a finished run; when that fails, mark the run failed in its ``results.json`` (so the
    sweep summary lists it) and raise one line naming the record.

    Args:
        record_dir: the sweep's record folder.
        results: the run's final ``results.json`` content.
        run: the resolved run config.
        results_path: the run's ``results.json``.
        command: the command line that re-runs this job alone (see :func:`build_record`).
    """
    path = record_path(record_dir, model_label(run["model"]), run["attention"]["name"], run.get("seed"))
    try:
        return write_record(path, build_record(results, run, command))
    except (OSError, ConfigError) as e:
        detail = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        message = f"record_dir: cannot write {path} ({detail}); the run trained but its record is missing"
    atomic_write_text(results_path, json.dumps({**results, "status": "failed", "error": message}, indent=2) + "\n")
    raise ConfigError(message)


def _number(low: float, high: float, integer: bool = False, optional: bool = False) -> Callable[[Any], str]:
    """A field check: a finite number (an integer where ``integer``) in [low, high]; returns what is wrong or ''."""
    def check(v: Any) -> str:
        if v is None and optional:
            return ""
        kind = (int,) if integer else (int, float)
        if not isinstance(v, kind) or isinstance(v, bool):
            return f"is {v!r}, not {'an integer' if integer else 'a number'}"
        if not (math.isfinite(v) and low <= v <= high):
            return f"is {v!r}, outside [{low:g}, {high:g}]"
        return ""
    return check


def _curve(v: Any) -> str:
    """A field check: null or a list of at most 10,000 fractions in [0, 1] (a top-1 per epoch)."""
    if v is None:
        return ""
    if not isinstance(v, list) or len(v) > 10_000:
        return "is not a list of at most 10,000 numbers"
    return next((p for p in map(_number(0.0, 1.0), v) if p), "")


def _text(v: Any) -> str:
    if v is None:
        return ""
    if not isinstance(v, str):
        return f"is {type(v).__name__}, not text"
    return "" if TEXT.fullmatch(v) else "holds characters or a length a record's text may not have"


def _command(v: Any) -> str:
    if v is None:
        return ""
    if not isinstance(v, str) or len(v) > 4000 or not v.isprintable() or "<!--" in v or "-->" in v:
        return "is not a one-line command of at most 4000 characters"
    return ""


def registered() -> dict[str, frozenset[str]]:
    """The names a record may hold: model variants, token reducers and attention backends, as registered now."""
    return {"models": frozenset(list_models()), "reducers": frozenset(REDUCTIONS.names()),
            "attention": frozenset(list_attention())}


def _model(v: Any, names: Mapping[str, frozenset[str]]) -> str:
    if not isinstance(v, str):
        return f"is {type(v).__name__}, not a model name"
    variant, _, reducer = v.partition("+")
    if variant not in names["models"] or (reducer and reducer not in names["reducers"]):
        return f"{v[:60]!r} is not a registered model (variant or <variant>+<token reducer>)"
    return ""


def _attention(v: Any, names: Mapping[str, frozenset[str]]) -> str:
    if not isinstance(v, str) or v not in names["attention"]:
        return f"{str(v)[:60]!r} is not a registered attention backend"
    return ""


def _interval(v: Any) -> str:
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        return f"is {v!r}, not [low, high]"
    return _number(0.0, 1.0)(v[0]) or _number(0.0, 1.0)(v[1])


COUNT = 1e15  # the upper bound of counts in a record (images, steps)
SCHEMA: dict[str, tuple[bool, Callable[..., str]]] = {  # field -> (required, check)
    "version": (True, lambda v: "" if v == RECORD_VERSION and type(v) is int else f"is {v!r}, not {RECORD_VERSION}"),
    "model": (True, _model), "attention": (True, _attention),  # checked against registered() names
    "seed": (True, _number(0, 2**63, integer=True)), "epochs": (True, _number(1, 1e6, integer=True)),
    "img_size": (True, _number(1, 1e5, integer=True)), "val_images": (True, _number(1, COUNT, integer=True)),
    "top1": (True, _number(0.0, 1.0)), "top1_ci95": (True, _interval),
    "top5": (False, _number(0.0, 1.0, optional=True)), "top1_tta": (False, _number(0.0, 1.0, optional=True)),
    "top1_per_epoch": (False, _curve), "command": (False, _command),
    "loss": (False, _number(-1e30, 1e30, optional=True)),
    "steps": (False, _number(0, COUNT, integer=True, optional=True)),
    "images_seen": (False, _number(0, COUNT, integer=True, optional=True)),
    "batch_size": (False, _number(0, COUNT, integer=True, optional=True)),
    "wall_s": (False, _number(0.0, 1e10, optional=True)), "lr": (False, _number(0.0, 1e6, optional=True)),
    **{k: (False, _text) for k in ("data", "experiment", "precision", "policy", "commit", "cpu", "torch", "python",
                                   "date")},
}


def check_record(record: Any, relpath: str, names: Optional[Mapping[str, frozenset[str]]] = None) -> dict[str, Any]:
    """``record`` if it follows :data:`SCHEMA` and lies where its fields say (``<model>/<attention>/seed<k>.json``);
    otherwise a :class:`~vitzoo.registry.ConfigError` naming ``relpath`` and the first bad field.

    Args:
        record: the parsed JSON.
        relpath: the file, relative to the record folder (named in the message).
        names: :func:`registered` (taken now when not given).
    """
    names = names or registered()
    if not isinstance(record, dict):
        raise ConfigError(f"{relpath}: the record is {type(record).__name__}, not a JSON object")
    for field in record:
        if field not in SCHEMA:
            raise ConfigError(f"{relpath}: field {str(field)[:40]!r} is not a field of a result record")
    for field, (required, check) in SCHEMA.items():
        if field not in record:
            if required:
                raise ConfigError(f"{relpath}: field {field} is missing")
            continue
        problem = check(record[field], names) if field in ("model", "attention") else check(record[field])
        if problem:
            raise ConfigError(f"{relpath}: field {field} {problem}")
    low, high = record["top1_ci95"]
    if not low - 1e-9 <= record["top1"] <= high + 1e-9:
        raise ConfigError(f"{relpath}: field top1 {record['top1']!r} lies outside its interval top1_ci95 {[low, high]}")
    where = (record["model"], record["attention"], f"seed{record['seed']}.json")
    if Path(relpath).parts[-3:] != where:
        raise ConfigError(f"{relpath}: fields model, attention and seed place the record at {'/'.join(where)}")
    return record


def _load(path: Path, rel: str) -> Any:
    """The JSON of one record file, or one line naming it (a FIFO, device or socket is refused, never opened
    for a blocking read)."""
    try:
        return json.loads(read_regular_text(path, RECORD_MAX_BYTES))
    except OSError as e:  # NotRegularFile included
        raise ConfigError(f"{rel}: not readable ({e.strerror or type(e).__name__})") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, nesting too deep
        raise ConfigError(f"{rel}: not a JSON record ({type(e).__name__})") from None


def read_records(folder: Any, skipped: Optional[list[str]] = None) -> list[dict[str, Any]]:
    """Every valid record under ``folder`` (recursively), each with ``path`` set to its file relative to ``folder``.

    A record that is not a regular file, unreadable, not JSON, off :data:`SCHEMA` or a second record of the same
    (model, attention, epochs, seed) is left out, with one line naming its file and field appended to ``skipped``.

    Args:
        folder: a record folder such as ``results/cifar10``.
        skipped: collects one line per record left out (None: they are dropped silently).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder of result records")
    out, seen, names = [], {}, registered()
    for p in sorted(folder.rglob("seed*.json")):
        rel = str(p.relative_to(folder))
        try:
            rec = check_record(_load(p, rel), rel, names)
            key = (rec["model"], rec["attention"], rec["epochs"], rec["seed"])
            if key in seen:
                raise ConfigError(f"{rel}: field seed repeats the record {seen[key]} (same model, attention, "
                                  f"epochs and seed)")
        except ConfigError as e:
            if skipped is not None:
                skipped.append(str(e))
            continue
        seen[key] = rel
        out.append({**rec, "path": rel})
    return out


def existing_record(record_dir: Optional[Any], run: Mapping[str, Any]) -> Optional[Path]:
    """The record file of this run if ``record_dir`` is set and the record exists, else ``None``."""
    if not record_dir:
        return None
    path = record_path(record_dir, model_label(run["model"]), run["attention"]["name"], run.get("seed"))
    return path if path.is_file() else None
