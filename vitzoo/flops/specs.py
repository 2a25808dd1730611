"""What ``scripts/flops.py`` builds: the default attention of a model, attention specs from
``configs/attention``, the published GMACs it compares against."""
from __future__ import annotations

from typing import Any, Optional

from torch import nn

import vitzoo
from vitzoo.configs import attention_options
from vitzoo.registry import ConfigError

PUBLISHED = {  # GMACs at 224 px as the papers report them ("FLOPs" there are multiply-adds)
    "vit_tiny": ("DeiT-T", 1.26), "vit_small": ("DeiT-S", 4.6), "vit_base": ("ViT-B/16 (DeiT-B)", 17.6),
    "swin_tiny": ("Swin-T", 4.5), "swin_small": ("Swin-S", 8.7), "swin_base": ("Swin-B", 15.4),
}


def default_attention(model: str) -> str:
    """The attention a model variant is measured with when none is given: its family's natural one
    (Swin: window, ViT: global), from the model registry.

    Args:
        model: a variant name from ``vitzoo.list_models()``.
    """
    return vitzoo.natural_attention(model)


def names(value: Any) -> Optional[list[str]]:
    """``"a,b"`` or ``["a", "b"]`` -> ``["a", "b"]``; None stays None."""
    if value is None:
        return None
    return [str(v).strip() for v in (value if isinstance(value, list) else str(value).split(",")) if str(v).strip()]


def spec_from_overrides(values: dict[str, Any], default: str) -> dict[str, Any]:
    """The attention spec from ``attention=`` (its YAML options) and ``attention.<option>=`` overrides.

    Args:
        values: the parsed ``key=value`` overrides.
        default: the backend when ``attention=`` is absent.
    """
    name = values.get("attention") or default
    if name not in vitzoo.list_attention():
        raise ConfigError(f"unknown attention '{name}'; choose attention= one of: {', '.join(vitzoo.list_attention())}")
    spec = attention_options(name)
    spec.update({k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("attention.")})
    return spec


def build(model: str, spec: Any, overrides: Optional[dict[str, Any]] = None) -> nn.Module:
    """``vitzoo.create_model`` (a ConfigError naming the option when the pair cannot be built).

    Args:
        model: variant name; spec: attention spec; overrides: ``model.<field>`` values.
    """
    return vitzoo.create_model(model, attention=spec, **(overrides or {}))
