"""Attention backends (token mixers): one file per family, one strict registry.

``register_attention(name, ConfigDataclass)`` registers a :class:`TokenMixer`;
``build_attention(spec, ctx)`` builds one from ``"name"`` or ``{"name": ..., **options}``.
Every module in this package is imported on first use, so a new file registers itself.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

from vitzoo.attention.base import MixerContext, QKVAttention, TokenMixer, dense_attention
from vitzoo.registry import ConfigError, Registry

ATTENTION = Registry("attention")
_SKIP = {"base"}


def register_attention(name: str, config_cls: type):
    """Class decorator registering a token mixer under ``name`` with its config dataclass."""
    return ATTENTION.register(name, config_cls)


def _load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name not in _SKIP and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


def list_attention() -> list[str]:
    """Names of every registered attention backend."""
    _load_all()
    return ATTENTION.names()


def attention_config(spec: str | Mapping[str, Any] | Any) -> Any:
    """Validate ``spec`` into the backend's config dataclass (strict: unknown/missing keys fail)."""
    _load_all()
    return ATTENTION.config(spec)


def attention_class(spec: str | Mapping[str, Any] | Any) -> type:
    cfg = attention_config(spec)
    return ATTENTION.get(ATTENTION.name_of(cfg))[0]


def build_attention(spec: str | Mapping[str, Any] | Any, ctx: MixerContext) -> TokenMixer:
    """Build a token mixer.

    Args:
        spec: ``"global"``, ``{"name": "linformer", "k": 64}`` or a config dataclass instance.
        ctx: dims, heads, grid and prefix tokens of the host block.
    """
    cfg = attention_config(spec)
    cls = ATTENTION.get(ATTENTION.name_of(cfg))[0]
    return cls(cfg, ctx)


__all__ = [
    "ATTENTION", "ConfigError", "MixerContext", "QKVAttention", "TokenMixer", "attention_class",
    "attention_config", "build_attention", "dense_attention", "list_attention", "register_attention",
]
