"""Attention backends (token mixers): one subpackage per family, one strict registry.

``register_attention(name, ConfigDataclass)`` registers a :class:`TokenMixer`;
``build_attention(spec, ctx)`` builds one from ``"name"`` or ``{"name": ..., **options}``.

Families (the subpackage a backend's module lives in, :func:`attention_family`):

* ``dense``: global softmax attention and Swin's shifted windows.
* ``sparse``: fixed sparse patterns (neighbourhoods, dilation, global tokens, Longformer, BigBird, per-head
  patterns, axial rows and columns).
* ``data_driven``: content-based selection (LSH, k-means routing, Sinkhorn sorting, ProbSparse queries).
* ``linear``: feature-map and channel attention (elu, Efficient Attention, Performer, RFA, ReLU, Hydra, XCA).
* ``low_rank``: projected or compressed keys and values (Linformer, Nyström, compressed).
* ``token_mixing``: attention-free or synthesised mixing (Synthesizer, FNet, gMLP, MLP-Mixer, GFNet, AFNO).

Every module of every family is imported on first use (:func:`list_attention`), so a new file registers itself.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

from torch import nn

from vitzoo.attention.base import MixerContext, QKVAttention, TokenMixer
from vitzoo.attention.functional import dense_attention
from vitzoo.registry import ConfigError, Registry

ATTENTION = Registry("attention")
FAMILY_PACKAGES = ("dense", "sparse", "data_driven", "linear", "low_rank", "token_mixing")


def register_attention(name: str, config_cls: type):
    """Class decorator registering a token mixer under ``name`` with its config dataclass."""
    return ATTENTION.register(name, config_cls)


def _load_all() -> None:
    """Import every public module of every family subpackage (each registers its backends)."""
    for family in FAMILY_PACKAGES:
        package = importlib.import_module(f"{__name__}.{family}")
        for info in pkgutil.iter_modules(package.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{package.__name__}.{info.name}")


def list_attention() -> list[str]:
    """Names of every registered attention backend."""
    _load_all()
    return ATTENTION.names()


def attention_config(spec: str | Mapping[str, Any] | Any) -> Any:
    """Validate ``spec`` into the backend's config dataclass (strict: unknown/missing keys fail)."""
    _load_all()
    return ATTENTION.config(spec)


def attention_class(spec: str | Mapping[str, Any] | Any) -> type:
    """The :class:`TokenMixer` subclass registered for ``spec`` (a name, a mapping or a config)."""
    cfg = attention_config(spec)
    return ATTENTION.get(ATTENTION.name_of(cfg))[0]


def attention_family(spec: str | Mapping[str, Any] | Any) -> str:
    """The family of a backend: the subpackage its class is defined in (one of :data:`FAMILY_PACKAGES`)."""
    module = attention_class(spec).__module__
    return module[len(__name__) + 1:].split(".")[0]


def build_attention(spec: str | Mapping[str, Any] | Any, ctx: MixerContext) -> TokenMixer:
    """Build a token mixer.

    Args:
        spec: ``"global"``, ``{"name": "linformer", "k": 64}`` or a config dataclass instance.
        ctx: dims, heads, grid and prefix tokens of the host block.
    """
    cfg = attention_config(spec)
    cls = ATTENTION.get(ATTENTION.name_of(cfg))[0]
    return cls(cfg, ctx)


def before_train_step(model: nn.Module) -> None:
    """Call :meth:`TokenMixer.before_train_step` of every token mixer in ``model``, once per training step and
    outside the (possibly compiled) forward: random-feature backends count the step and redraw there.

    Args:
        model: a network or a single mixer.
    """
    for module in model.modules():
        if isinstance(module, TokenMixer):
            module.before_train_step()


__all__ = [
    "ATTENTION", "FAMILY_PACKAGES", "ConfigError", "MixerContext", "QKVAttention", "TokenMixer", "attention_class",
    "attention_config", "attention_family", "before_train_step", "build_attention", "dense_attention",
    "list_attention", "register_attention",
]
