"""Checks for data read back from files vitzoo wrote (exports, checkpoints): plain data, never code.

No Lightning import here: :func:`vitzoo.load_model` uses it for inference-only installs.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vitzoo.registry import ConfigError

PLAIN = (str, int, float, bool, type(None))


def plain_data(value: Any, where: str) -> None:
    """Raise a one-line ConfigError unless ``value`` is JSON-like plain data without OmegaConf interpolations.

    Args:
        value: what was read back (dicts with string keys, lists, str, int, float, bool, None).
        where: what it was read from and its key path, named in the message.
    """
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"{where}: key {key!r} is not a string; the file is not plain vitzoo data")
            plain_data(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            plain_data(item, f"{where}[{i}]")
    elif not isinstance(value, PLAIN):
        raise ConfigError(f"{where} is a {type(value).__name__}, not plain data; the file is not plain vitzoo data")
    elif isinstance(value, str) and "${" in value:
        raise ConfigError(f"{where}={value!r} is an interpolation; files read back must hold plain values")


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from ``path`` (plain data checked), or a one-line ConfigError naming the file.

    Args:
        path: the file to read.
        what: what the file is, for messages (e.g. ``"export config"``).
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(
            f"cannot read {what} {path} ({type(e).__name__}: {e.strerror if isinstance(e, OSError) else e.reason})"
        ) from None
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{what} {path} is not valid JSON ({e.msg} at line {e.lineno}); re-export the model"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} is not a JSON object; re-export the model")
    plain_data(data, str(path))
    return data


def export_options(config: Mapping[str, Any], source: Path) -> dict[str, Any]:
    """``model_options`` of an export config: a mapping (its keys are checked by the model registry)."""
    options = config.get("model_options")
    if not isinstance(options, Mapping):
        raise ConfigError(f"{source}: model_options is missing or not a mapping; re-export the model")
    return dict(options)


def load_weights(load: Any, source: Path) -> None:
    """Call ``load()`` (a safetensors load into a model); a truncated file or mismatched weights is one line.

    Args:
        load: loads the weights into the model (raises on a bad file or mismatch).
        source: the weights file, named in the message.
    """
    try:
        load()
    except Exception as e:  # SafetensorError (truncated/corrupt header), RuntimeError (missing keys, shapes)
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        detail = lines[1] if len(lines) > 1 else lines[0] if lines else type(e).__name__
        raise ConfigError(
            f"{source}: cannot load the weights ({type(e).__name__}: {detail}); re-export the model"
        ) from None
