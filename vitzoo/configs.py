"""The one reader of the Hydra option files shipped with the package (``vitzoo/conf/<group>/<option>.yaml``).

Scripts, benchmarks and tests that need "what ``attention=<name>`` composes" outside Hydra read it
here, so there is one loader (not one per caller).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CONFIG_DIR = Path(__file__).resolve().parent / "conf"  # package data: installed with vitzoo


def group_options(group: str, option: str) -> dict[str, Any]:
    """The values of ``conf/<group>/<option>.yaml`` (its ``defaults:`` list dropped); ``{}`` if absent.

    Args:
        group: config group folder, e.g. ``"attention"``.
        option: file name without ``.yaml``, e.g. ``"linformer"``.
    """
    path = CONFIG_DIR / group / f"{option}.yaml"
    values = dict(yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
    values.pop("defaults", None)
    return values


def attention_options(name: str) -> dict[str, Any]:
    """``{"name": name, **options}`` as ``attention=<name>`` composes it (dataclass defaults if no YAML)."""
    return {**group_options("attention", name), "name": name}
