"""The one reader of the Hydra option files (``configs/<group>/<option>.yaml``, installed as ``vitzoo/conf``).

Scripts, benchmarks and tests that need "what ``attention=<name>`` composes" outside Hydra read it
here, so there is one loader (not one per caller).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

PACKAGE_DIR = Path(__file__).resolve().parent


def find_config_dir() -> Path:
    """The Hydra configs: ``vitzoo/conf`` in an installed wheel (``configs/`` shipped as package data),
    else ``configs/`` beside the package in a source checkout (editable install, ``PYTHONPATH``)."""
    packaged = PACKAGE_DIR / "conf"
    return packaged if packaged.is_dir() else PACKAGE_DIR.parent / "configs"


CONFIG_DIR = find_config_dir()  # the one place every reader of the option files takes the folder from


def group_options(group: str, option: str) -> dict[str, Any]:
    """The values of ``configs/<group>/<option>.yaml`` (its ``defaults:`` list dropped); ``{}`` if absent.

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
