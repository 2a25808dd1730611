"""The model registry: :data:`MODELS` (variant name -> backbone class and its config defaults),
:func:`register_model` for the families, and building a variant from scratch.

The families (:mod:`~vitzoo.models.vit`, :mod:`~vitzoo.models.swin`) register their variants with
:func:`register_model`; :func:`vitzoo.models.create_model` adds pretrained weights on top of :func:`build_model`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

from torch import nn

from vitzoo.attention import ATTENTION
from vitzoo.registry import ConfigError, Registry

MODELS = Registry("model")
# model config field -> (smallest, largest) allowed value: checked before anything is allocated
INT_RANGES = {
    "img_size": (1, 4096),
    "patch_size": (1, 4096),
    "in_chans": (1, 64),
    "num_classes": (1, 1_000_000),
    "embed_dim": (1, 16384),
    "depth": (1, 1000),
    "depths": (1, 1000),
    "num_heads": (1, 1024),
    "window_size": (1, 4096),
    "stem_full_res_convs": (0, 8),
}
FLOAT_RANGES = {  # field -> (low, high, low allowed): drop rates are probabilities, the rest positive
    "mlp_ratio": (0.0, 64.0, False),
    "drop_rate": (0.0, 1.0, True),
    "attn_drop_rate": (0.0, 1.0, True),
    "drop_path_rate": (0.0, 1.0, True),
    "norm_eps": (0.0, 1.0, False),
}


def _check_int(name: str, value: Any) -> None:
    low, high = INT_RANGES[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"model.{name} must be an integer in [{low}, {high}] (got {value!r})")
    if not low <= value <= high:
        raise ConfigError(f"model.{name}={value} is out of range; choose an integer in [{low}, {high}]")


def _check_float(name: str, value: Any) -> None:
    low, high, low_ok = FLOAT_RANGES[name]
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not number or not (low <= value if low_ok else low < value) or not value < high + (name[-5:] != "_rate"):
        side = "[" if low_ok else "("
        raise ConfigError(f"model.{name} must be a finite number in {side}{low}, {high}) (got {value!r})")


def check_ranges(cfg: Any) -> None:
    """Type- and range-check every number of a model config dataclass (one line naming the field).

    Runs first in the configs' ``__post_init__``, so a config read from a file (``embed_dim: 1e9``,
    ``depth: -1``, ``drop_rate: NaN``) fails before any tensor is allocated.

    Args:
        cfg: a :class:`~vitzoo.models.vit.ViTConfig` or :class:`~vitzoo.models.swin.SwinConfig`.
    """
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in INT_RANGES:
            for item in value if isinstance(value, (list, tuple)) else [value]:
                _check_int(f.name, item)
            if isinstance(value, (list, tuple)) and not value:
                raise ConfigError(f"model.{f.name} must not be empty")
        elif f.name in FLOAT_RANGES:
            _check_float(f.name, value)
    if cfg.patch_size > cfg.img_size:
        raise ConfigError(f"model.patch_size ({cfg.patch_size}) is larger than model.img_size ({cfg.img_size})")


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


def _block_params(c: int, mlp_ratio: float) -> int:
    return 2 * c * int(c * mlp_ratio)  # the two MLP matrices (token mixers may have no weights at all)


def estimate_params(cfg: Any) -> int:
    """A lower bound on the parameter count of a config (its large matrices), computed without building it.

    Loading compares it with the weights a file holds before allocating the model.

    Args:
        cfg: a checked ViT or Swin config dataclass.
    """
    c, grid = cfg.embed_dim, cfg.img_size // cfg.patch_size
    total = cfg.in_chans * cfg.patch_size**2 * c
    # Swin: channels double per stage, a 2x2 merge (4C -> 2C, C of the stage before) between stages
    if hasattr(cfg, "depths"):
        for i, depth in enumerate(cfg.depths):
            total += depth * _block_params(c * 2**i, cfg.mlp_ratio) + (2 * (c * 2**i) ** 2 if i else 0)
        return total + c * 2 ** (len(cfg.depths) - 1) * cfg.num_classes
    return total + grid * grid * c + cfg.depth * _block_params(c, cfg.mlp_ratio) + c * cfg.num_classes


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


def model_fields(name: Optional[str] = None) -> list[str]:
    """The fields ``model.<field>=`` accepts: those of the variant's config dataclass (None: of every family's).

    Args:
        name: a variant from :func:`list_models`, or None for the union over every registered family.
    """
    classes = {MODELS.get(n)[1] for n in ([name] if name is not None else MODELS.names())}
    return sorted({f.name for c in classes for f in dataclasses.fields(c) if f.init})


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


__all__ = ["MODELS", "attention_spec", "build_model", "check_ranges", "estimate_params", "list_models", "model_config",
           "model_fields", "model_kwargs", "natural_attention", "register_model"]
