"""A strict name -> (class, config dataclass) registry.

Every extension point of vitzoo (attention backends, model variants) is a :class:`Registry`.
Strictness is the point: an unknown name, an unknown option or a missing required option is a
:class:`ConfigError` that names the option to change, never silently swallowed (xformers lost
options through ``**kwargs``).
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any, Callable


class ConfigError(ValueError):
    """A bad option. The message is one line and names the option to change."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises a one-line :class:`ConfigError` instead of printing usage and exiting (the scripts'
    command lines: flops, plan, export, predict)."""

    def error(self, message: str):
        raise ConfigError(message)


def _fields(config_cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(config_cls) if f.init}


def _required(field: dataclasses.Field) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def build_config(config_cls: type, options: Mapping[str, Any], prefix: str) -> Any:
    """Build ``config_cls`` from ``options``, rejecting unknown and missing keys.

    Args:
        config_cls: a dataclass whose ``__post_init__`` may validate values (raising ConfigError).
        options: plain mapping of option name -> value (Hydra/OmegaConf containers are accepted).
        prefix: dotted config path used in error messages, e.g. ``"attention"``.
    """
    fields = _fields(config_cls)
    unknown = sorted(set(options) - set(fields))
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), sorted(fields), n=1)  # a typo: name the nearest option
        raise ConfigError(
            f"unknown option {prefix}.{unknown[0]} for {config_cls.__name__}; "
            + (f"did you mean {prefix}.{close[0]}? " if close else "")
            + f"valid options: {', '.join(sorted(fields)) or '(none)'}"
        )
    missing = sorted(n for n, f in fields.items() if _required(f) and n not in options)
    if missing:
        raise ConfigError(f"missing required option {prefix}.{missing[0]} for {config_cls.__name__}")
    return config_cls(**dict(options))


class Registry:
    """Maps a name to a class, its config dataclass and (for variants) the defaults that differ from it.

    Args:
        kind: what is registered (used in messages), e.g. ``"attention"`` or ``"model"``.
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, tuple[type, type]] = {}
        self._defaults: dict[str, dict[str, Any]] = {}

    def register(self, name: str, config_cls: type) -> Callable[[type], type]:
        """Class decorator: ``@registry.register("linformer", LinformerConfig)``."""
        if not dataclasses.is_dataclass(config_cls):
            raise TypeError(f"{self.kind} '{name}': config class must be a dataclass")

        def deco(cls: type) -> type:
            if name in self._entries and self._entries[name][0] is not cls:
                raise KeyError(f"{self.kind} '{name}' is registered twice")
            if any(c is config_cls and n != name for n, (_, c) in self._entries.items()):
                raise KeyError(f"{self.kind} '{name}': config class {config_cls.__name__} is already used")
            self._entries[name] = (cls, config_cls)
            cls.registry_name = name
            cls.config_class = config_cls
            return cls

        return deco

    def register_variant(self, name: str, cls: type, config_cls: type, defaults: Mapping[str, Any]) -> None:
        """Register ``name`` as ``cls`` built from ``config_cls`` with ``defaults`` on top of its field defaults.

        Several variants may share a class (``vit_tiny`` and ``vit_base`` are both a VisionTransformer);
        the defaults are validated now, so a typo fails at import.

        Args:
            name: the variant's name, e.g. ``"vit_tiny"``.
            cls: the class built from the config (called as ``cls(config, ...)``).
            config_cls: the dataclass the options fill.
            defaults: option -> value where the variant differs from ``config_cls``'s defaults.
        """
        if name in self._entries:
            raise KeyError(f"{self.kind} '{name}' is registered twice")
        build_config(config_cls, defaults, f"{self.kind}[{name}]")
        self._entries[name] = (cls, config_cls)
        self._defaults[name] = dict(defaults)

    def defaults(self, name: str) -> dict[str, Any]:
        """The options ``name`` was registered with (``{}`` for a plain :meth:`register`)."""
        self.get(name)
        return dict(self._defaults.get(name, {}))

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def get(self, name: str) -> tuple[type, type]:
        """Return ``(cls, config_cls)`` for ``name`` or raise ConfigError listing the choices."""
        if name not in self._entries:
            raise ConfigError(f"unknown {self.kind} '{name}'; choose {self.kind}= one of: {', '.join(self.names())}")
        return self._entries[name]

    def config(self, spec: str | Mapping[str, Any] | Any) -> Any:
        """Turn ``"name"``, ``{"name": ..., **options}`` or a config instance into a config instance.

        A variant's registered defaults come first, ``spec``'s options on top.
        """
        if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
            return spec
        if isinstance(spec, str):
            spec = {"name": spec}
        options = dict(spec)
        if "name" not in options:
            raise ConfigError(f"missing {self.kind}.name; choose one of: {', '.join(self.names())}")
        name = options.pop("name")
        _, config_cls = self.get(name)
        return build_config(config_cls, {**self._defaults.get(name, {}), **options}, self.kind)

    def name_of(self, config: Any) -> str:
        """The name registered with ``config``'s class (one name per class, as :meth:`register` ensures)."""
        for name, (_, config_cls) in self._entries.items():
            if type(config) is config_cls:
                return name
        raise ConfigError(f"{type(config).__name__} is not a registered {self.kind} config")

    def to_dict(self, config: Any) -> dict[str, Any]:
        """Inverse of :meth:`config`: ``{"name": ..., **options}`` with plain values."""
        return {"name": self.name_of(config), **dataclasses.asdict(config)}
