"""The command line before Hydra composes: one-line errors instead of Hydra's multi-line blocks, and
``model.<field>=`` for every field of the model's config.

- ``attention=bogus`` is one line naming the choices (Hydra would print a "Could not find" block).
- ``attention.num_feature=8`` is one line with the closest option (``did you mean attention.num_features?``).
- ``model.depth=2`` sets a field of the model's config dataclass that its YAML leaves out (Hydra alone needs
  ``+model.depth=2``, which keeps working); a field of no model family stays an unknown option.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import sys
import typing
from collections.abc import Sequence
from typing import Any, Optional

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, ValueType
from omegaconf import OmegaConf

from vitzoo.configs import CONFIG_DIR
from vitzoo.models.factory import model_fields
from vitzoo.registry import ConfigError


def group_choices(group: str) -> list[str]:
    """The options of ``configs/<group>/`` (file names without ``.yaml``)."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def check_group_choices(args: Sequence[str]) -> None:
    """Raise a one-line ConfigError for a ``group=option`` override naming an option that does not exist.

    Args:
        args: command-line arguments (flags such as ``-m`` are skipped; Hydra's own ``hydra/*`` groups too).
    """
    overrides = [a for a in args if not a.startswith("-") and "=" in a]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # noqa: BLE001 - a syntax error is Hydra's to report
        return
    for override in parsed:
        group = override.key_or_group
        if group.startswith("hydra") or not (CONFIG_DIR / group).is_dir() or override.is_delete():
            continue
        choices = group_choices(group)
        if override.value_type == ValueType.GLOB_CHOICE_SWEEP:  # glob(*) picks among existing options only
            continue
        values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
        if len(values) == 1 and isinstance(values[0], list):  # logger=[csv,wandb]: several options of one group
            values = values[0]
        for value in values:
            if value is not None and str(value) not in choices:
                raise ConfigError(f"unknown {group} '{value}'; choose {group}= one of: {', '.join(choices)}")


def number_fields() -> set[str]:
    """The ``optim`` fields that hold a number (Hydra checks them against :class:`OptimConfig` in a multi-line
    block; :func:`check_numbers` says it in one line first)."""
    from vitzoo.training.module import OptimConfig

    hints = typing.get_type_hints(OptimConfig)
    return {f.name for f in dataclasses.fields(OptimConfig) if hints[f.name] in (float, typing.Optional[float])}


def check_numbers(args: Sequence[str]) -> None:
    """Raise a one-line ConfigError for ``optim.<number field>=<not a number>`` (e.g. ``optim.lr=abc``).

    Args:
        args: command-line arguments.
    """
    fields = number_fields()
    for arg in args:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or not key.startswith("optim.") or key[len("optim."):] not in fields or "," in value:
            continue
        if value.strip() in ("null", "~", "") or "${" in value:
            continue
        try:
            float(value)
        except ValueError:
            raise ConfigError(f"{key} must be a number (got {value!r})") from None


def yaml_model_keys() -> set[str]:
    """The keys every variant's ``configs/model/*.yaml`` sets (a ``# @package _global_`` file under its ``model:``);
    a preset (a file with a defaults list, e.g. ``vit_cifar_fast``) inherits its variant's keys and adds options."""
    keys: Optional[set[str]] = None
    for path in sorted((CONFIG_DIR / "model").glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        if "defaults" in data:
            continue
        node = data.get("model", data) if "model" in data else data
        keys = set(node) if keys is None else keys & set(node)
    return keys or set()


def add_model_fields(args: Sequence[str]) -> list[str]:
    """``args`` with every ``model.<field>=`` that names a model config field the model YAMLs leave out written
    as Hydra's ``++model.<field>=`` (set, adding the key), so it works without a ``+``. The model's own config
    dataclass still checks the field: ``model.depth=2`` on a Swin model fails with one line naming
    ``model.depth``.

    Args:
        args: command-line arguments.
    """
    fields = set(model_fields()) - yaml_model_keys()
    out = []
    for arg in args:
        key, sep, _ = arg.partition("=")
        parts = key.split(".")
        if sep and len(parts) == 2 and parts[0] == "model" and parts[1] in fields:
            arg = f"++{arg}"
        out.append(arg)
    return out


def _compose_line(override: Override) -> str:
    """The override as one ``key=value`` line for :func:`hydra.compose`, a sweep reduced to its first value."""
    if not override.is_sweep_override():
        return override.input_line
    first = next(iter(override.sweep_string_iterator()))
    prefix = re.match(r"[+~]*", override.input_line).group(0)
    package = f"@{override.package}" if override.package else ""
    return f"{prefix}{override.key_or_group}{package}={first}"


def _compose(config_name: str, lines: list[str]) -> Any:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3", job_name=config_name):
        return compose(config_name, overrides=lines)


def unknown_key_message(key: str, cfg: Any) -> str:
    """One line for an override of a key the composed config ``cfg`` does not have, naming the closest key.

    Args:
        key: the dotted key, e.g. ``attention.num_feature``.
        cfg: the config composed without that override.
    """
    tree = OmegaConf.to_container(cfg, resolve=False)
    parts = key.split(".")
    node, depth = tree, 0
    while depth < len(parts) - 1 and isinstance(node, dict) and isinstance(node.get(parts[depth]), dict):
        node, depth = node[parts[depth]], depth + 1
    parent = ".".join(parts[:depth])
    candidates = [str(k) for k in node] if isinstance(node, dict) else []
    if parent == "model" and isinstance(node, dict) and node.get("name") is not None:
        try:
            candidates += model_fields(str(node["name"]))
        except ConfigError:
            pass
    choice = f" for {parent}={node['name']}" if parent and isinstance(node, dict) and "name" in node else ""
    path = f"{parent}." if parent else ""
    close = difflib.get_close_matches(parts[depth], sorted(set(candidates)), n=1)
    if close:
        return f"unknown option {key}{choice}; did you mean {path}{close[0]}?"
    listed = ", ".join(sorted(set(candidates)))
    return f"unknown option {key}{choice}; options{' of ' + parent if parent else ''}: {listed or '(none)'}"


def check_keys(args: Sequence[str], config_name: str = "train") -> None:
    """Raise a one-line ConfigError, with the closest match, for ``key=value`` naming a key the config lacks.

    Composes the config as Hydra will (a sweep at its first value); other composition errors are left to Hydra.

    Args:
        args: command-line arguments (after :func:`add_model_fields`).
        config_name: ``train`` or ``eval``.
    """
    try:
        parsed = OverridesParser.create().parse_overrides([a for a in args if not a.startswith("-") and "=" in a])
    except Exception:  # noqa: BLE001 - a syntax error is Hydra's to report
        return
    if any(o.value_type == ValueType.GLOB_CHOICE_SWEEP for o in parsed):
        return
    lines = [_compose_line(o) for o in parsed if not o.key_or_group.startswith("hydra")]
    try:
        _compose(config_name, lines)
        return
    except Exception as e:  # noqa: BLE001 - only a missing key is reported here
        match = re.match(r"Could not override '([^']+)'", str(e))
    if match is None:
        return
    bad = match.group(1)
    try:
        cfg = _compose(config_name, [line for line in lines if line.partition("=")[0].lstrip("+~") != bad])
    except Exception:  # noqa: BLE001 - another error: Hydra reports it
        return
    raise ConfigError(unknown_key_message(bad, cfg))


def check_command_line(args: Optional[Sequence[str]] = None, config_name: str = "train") -> list[str]:
    """:func:`add_model_fields`, then :func:`check_group_choices`, :func:`check_numbers` and :func:`check_keys`
    for an entry point: exit 1 with ``error: <one line>`` on a bad option.

    Args:
        args: command-line arguments; None: ``sys.argv[1:]``, rewritten in place for Hydra.
        config_name: the primary config, ``train`` or ``eval``.

    Returns:
        The arguments as Hydra gets them.
    """
    given = list(sys.argv[1:] if args is None else args)
    out = add_model_fields(given) if config_name == "train" else given
    if args is None:
        sys.argv[1:] = out
    if any(a in ("-h", "--help", "--hydra-help") for a in out):
        return out
    try:
        check_group_choices(out)
        check_numbers(out)
        check_keys(out, config_name)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    return out
