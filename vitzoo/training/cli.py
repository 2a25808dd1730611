"""Command-line checks that run before Hydra composes: ``attention=bogus`` is one line naming the choices
(Hydra would print a multi-line "Could not find" block)."""
from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType

from vitzoo.configs import CONFIG_DIR
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


def check_command_line(args: Sequence[str] = tuple(sys.argv[1:])) -> None:
    """:func:`check_group_choices` and :func:`check_numbers` for an entry point: exit 1 with
    ``error: <one line>`` on a bad option."""
    try:
        check_group_choices(args)
        check_numbers(args)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
