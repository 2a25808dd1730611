"""Backbones and their named variants (``vit_tiny`` … ``swin_base``, ``vit_cifar``, ``swin_cifar``).

Each variant is declared once, next to its family, with :func:`register_model`; :data:`MODELS` is the
strict registry (:mod:`~vitzoo.models.factory`) behind :func:`create_model`, :func:`list_models` and
:func:`model_config`; :mod:`~vitzoo.models.pretrained` starts a variant from timm weights.
"""
from __future__ import annotations

from typing import Any, Optional

from torch import nn

from vitzoo.models.factory import (
    MODELS,
    attention_spec,
    build_model,
    list_models,
    model_config,
    model_kwargs,
    natural_attention,
    register_model,
)
from vitzoo.models.pretrained import create_pretrained
from vitzoo.models.swin import SwinConfig, SwinTransformer
from vitzoo.models.vit import VisionTransformer, ViTConfig


def create_model(name: str, attention: Any = None, pretrained: Optional[str] = None, **overrides: Any) -> nn.Module:
    """Build a backbone by variant name.

    Args:
        name: a variant from :func:`list_models`.
        attention: ``"window"``, ``{"name": "linformer", "k": 64}`` or a config instance: the token mixer
            of every block (validated once). None: the variant's :func:`natural_attention`.
        pretrained: weights to start from: a timm-format file or ``timm:<name>`` (:mod:`vitzoo.models.pretrained`).
        **overrides: any field of the family config (``num_classes``, ``img_size``, ``depth`` …).
    """
    if pretrained is not None:
        return create_pretrained(name, attention, pretrained, **overrides)
    return build_model(name, attention, **overrides)


__all__ = [
    "MODELS",
    "SwinConfig",
    "SwinTransformer",
    "ViTConfig",
    "VisionTransformer",
    "attention_spec",
    "create_model",
    "list_models",
    "model_config",
    "model_kwargs",
    "natural_attention",
    "register_model",
]
