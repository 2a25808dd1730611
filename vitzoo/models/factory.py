"""The model registry: :data:`MODELS` (variant name -> backbone class and its config defaults),
:func:`register_model` for the families, and building a variant from scratch.

The families (:mod:`~vitzoo.models.vit`, :mod:`~vitzoo.models.swin`) register their variants with
:func:`register_model`; :func:`vitzoo.models.create_model` adds pretrained weights on top of :func:`build_model`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from torch import nn

from vitzoo.attention import ATTENTION
from vitzoo.registry import Registry

MODELS = Registry("model")


def register_model(family: type) -> Callable[[Callable[[], dict[str, Any]]], Callable[[], dict[str, Any]]]:
    """Function decorator: the function's name is the variant, its return value the variant's defaults.

    Args:
        family: the backbone class; it declares ``config_class`` (its dataclass) and
            ``natural_attention`` (the attention a variant gets when none is given).

    >>> @register_model(VisionTransformer)
    ... def vit_tiny() -> dict:
    ...     return dict(embed_dim=192, depth=12, num_heads=3)  # fields of ViTConfig that differ
    """

    def deco(fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        MODELS.register_variant(fn.__name__, family, family.config_class, fn())
        return fn

    return deco


def list_models() -> list[str]:
    """Names of every model variant."""
    return MODELS.names()


def model_config(name: str, **overrides: Any) -> Any:
    """The variant's config dataclass with ``overrides`` applied (unknown names and keys are ConfigErrors).

    Args:
        name: a variant from :func:`list_models`.
        **overrides: fields of the family's config dataclass, checked by it.
    """
    return MODELS.config({"name": name, **overrides})


def natural_attention(name: str) -> str:
    """The attention a variant is built with when none is given: its family's (Swin: window, ViT: global)."""
    return MODELS.get(name)[0].natural_attention


def build_model(name: str, attention: Any = None, **overrides: Any) -> nn.Module:
    """Build a backbone by variant name, initialised from scratch.

    Args:
        name: a variant from :func:`list_models`.
        attention: ``"window"``, ``{"name": "linformer", "k": 64}`` or a config instance: the token mixer
            of every block (validated once). None: the variant's :func:`natural_attention`.
        **overrides: any field of the family config (``num_classes``, ``img_size``, ``depth`` …).
    """
    cfg = model_config(name, **overrides)
    model = MODELS.get(name)[0](cfg, attention)
    model.variant = name
    return model


def model_kwargs(model: nn.Module) -> dict[str, Any]:
    """Plain-data description of a built model: enough to rebuild it with :func:`create_model`."""
    return dataclasses.asdict(model.cfg)


def attention_spec(model: nn.Module) -> dict[str, Any]:
    """``{"name": ..., **options}`` of a built model's token mixer (``model.attention_cfg``, shared by every block)."""
    return ATTENTION.to_dict(model.attention_cfg)


__all__ = ["MODELS", "attention_spec", "build_model", "list_models", "model_config", "model_kwargs",
           "natural_attention", "register_model"]
