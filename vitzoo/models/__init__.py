"""Backbones and their named variants (``vit_tiny`` … ``swin_base``, ``vit_cifar``, ``swin_cifar``)."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from torch import nn

from vitzoo.models.swin import SwinConfig, SwinTransformer
from vitzoo.models.vit import ViTConfig, VisionTransformer
from vitzoo.registry import ConfigError, build_config

FAMILIES: dict[str, tuple[type, type]] = {"vit": (VisionTransformer, ViTConfig), "swin": (SwinTransformer, SwinConfig)}

# name -> (family, defaults that differ from the family's config dataclass)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "vit_tiny": ("vit", dict(embed_dim=192, depth=12, num_heads=3)),  # DeiT-T: 5.7M params, 1.26 GMACs
    "vit_small": ("vit", dict(embed_dim=384, depth=12, num_heads=6)),  # DeiT-S: 22M, 4.6 GMACs
    "vit_base": ("vit", dict(embed_dim=768, depth=12, num_heads=12)),  # DeiT-B / ViT-B/16: 86M, 17.6 GMACs
    "vit_cifar": ("vit", dict(img_size=32, patch_size=4, num_classes=10, embed_dim=192, depth=6, num_heads=3,
                              mlp_ratio=2.0, window_size=4, drop_path_rate=0.1)),
    "swin_tiny": ("swin", dict(embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24])),  # 28M, 4.5 GMACs
    "swin_small": ("swin", dict(embed_dim=96, depths=[2, 2, 18, 2], num_heads=[3, 6, 12, 24], drop_path_rate=0.3)),
    "swin_base": ("swin", dict(embed_dim=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32], drop_path_rate=0.5)),
    "swin_cifar": ("swin", dict(img_size=32, patch_size=2, num_classes=10, embed_dim=64, depths=[2, 2, 2],
                                num_heads=[2, 4, 8], window_size=4, mlp_ratio=2.0, drop_path_rate=0.1)),
}


def list_models() -> list[str]:
    """Names of every model variant."""
    return sorted(VARIANTS)


def model_config(name: str, **overrides: Any) -> Any:
    """The variant's config dataclass with ``overrides`` applied (unknown keys are errors)."""
    if name not in VARIANTS:
        raise ConfigError(f"unknown model '{name}'; choose model= one of: {', '.join(list_models())}")
    family, defaults = VARIANTS[name]
    return build_config(FAMILIES[family][1], {**defaults, **overrides}, "model")


def create_model(name: str, attention: Any = "global", pretrained: Optional[str] = None, **overrides: Any) -> nn.Module:
    """Build a backbone by variant name.

    Args:
        name: a variant from :func:`list_models`.
        attention: ``"window"`` or ``{"name": "linformer", "k": 64}``: the token mixer of every block.
        pretrained: weights to start from: a timm-format file or ``timm:<name>`` (:mod:`vitzoo.pretrained`).
        **overrides: any field of the family config (``num_classes``, ``img_size``, ``depth`` …).
    """
    if pretrained is not None:
        from vitzoo.pretrained import create_pretrained

        return create_pretrained(name, attention, pretrained, **overrides)
    cfg = model_config(name, **overrides)
    cls = FAMILIES[VARIANTS[name][0]][0]
    model = cls(cfg, attention)
    model.variant = name
    return model


def model_kwargs(model: nn.Module) -> dict[str, Any]:
    """Plain-data description of a built model: enough to rebuild it with :func:`create_model`."""
    return dataclasses.asdict(model.cfg)


__all__ = ["FAMILIES", "VARIANTS", "SwinTransformer", "VisionTransformer", "create_model", "list_models", "model_config"]
