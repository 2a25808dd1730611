"""Reference implementations vitzoo is timed against: timm's ViT / Swin, and the performer-pytorch,
linformer and natten layers (optional extras, imported only when installed)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from timm.models.swin_transformer import SwinTransformer as TimmSwin
from timm.models.vision_transformer import VisionTransformer as TimmViT
from torch import nn

from vitzoo.attention import MixerContext
from vitzoo.measure.environment import package_version
from vitzoo.models.swin import SwinConfig
from vitzoo.models.vit import ViTConfig

NOT_INSTALLED = "not installed (pip install -e '.[bench]')"
# backend needed for a model-level timm comparison, per model family (vitzoo.bench.options.model_family)
MODEL_REFERENCES = {"vit": ("global", "timm VisionTransformer"), "swin": ("window", "timm SwinTransformer")}
# layer-level references: backend -> (importable module, description)
LAYER_REFERENCES = {
    "performer": ("performer_pytorch", "performer-pytorch SelfAttention"),
    "linformer": ("linformer", "linformer LinformerSelfAttention"),
    "local": ("natten", "natten NeighborhoodAttention2D"),
    "dilated": ("natten", "natten NeighborhoodAttention2D (dilated)"),
}

Reference = tuple[nn.Module, dict[str, Any], Callable]


class ReferenceUnavailable(Exception):
    """The reference package is missing or has no counterpart for this backend/model."""


def timm_reference(model: nn.Module) -> nn.Module:
    """timm's ``VisionTransformer`` / ``SwinTransformer`` with exactly the configuration of a vitzoo
    ``global`` ViT / ``window`` Swin (same dims, depth, heads, MLP ratio, qkv bias, class token,
    image/patch size, window, dropout and stochastic depth).

    Args:
        model: a vitzoo ``VisionTransformer`` (global attention) or ``SwinTransformer`` (window).
    """
    cfg = model.cfg
    if isinstance(cfg, ViTConfig):
        return TimmViT(
            img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans, num_classes=cfg.num_classes,
            global_pool=cfg.global_pool, embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads,
            mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias, class_token=cfg.class_token,
            fc_norm=False,  # vitzoo: final norm on all tokens, then pooling (timm's default for 'token')
            drop_rate=cfg.drop_rate, attn_drop_rate=cfg.attn_drop_rate, drop_path_rate=cfg.drop_path_rate)
    if isinstance(cfg, SwinConfig):
        attn = model.stages[0].blocks[0].attn
        window = getattr(attn.cfg, "window_size", None) or cfg.window_size
        return TimmSwin(
            img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans, num_classes=cfg.num_classes,
            global_pool="avg", embed_dim=cfg.embed_dim, depths=tuple(cfg.depths), num_heads=tuple(cfg.num_heads),
            window_size=window, mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias, drop_rate=cfg.drop_rate,
            attn_drop_rate=cfg.attn_drop_rate, drop_path_rate=cfg.drop_path_rate)
    raise ReferenceUnavailable(f"no timm counterpart for {type(model).__name__}")


def _option(cfg: Any, name: str, default: Any) -> Any:
    """Option ``name`` of the backend's config dataclass, or ``default`` where the config has no such field."""
    return getattr(cfg, name) if name in {f.name for f in dataclasses.fields(cfg)} else default


def _performer(cfg: Any, ctx: MixerContext) -> Reference:
    from performer_pytorch import SelfAttention  # optional extra: imported only once known to be installed

    kwargs = dict(dim=ctx.dim, heads=ctx.num_heads, dim_head=ctx.dim // ctx.num_heads, causal=False,
                  nb_features=cfg.num_features, generalized_attention=False,  # performer: the softmax kernel
                  qkv_bias=ctx.qkv_bias, attn_out_bias=True)
    module = SelfAttention(**kwargs)
    return module, kwargs, module


def _linformer(cfg: Any, ctx: MixerContext) -> Reference:
    from linformer import LinformerSelfAttention  # optional extra: imported only once known to be installed

    kwargs = dict(dim=ctx.dim, seq_len=ctx.num_prefix + ctx.grid[0] * ctx.grid[1],
                  k=cfg.k, heads=ctx.num_heads, dim_head=ctx.dim // ctx.num_heads,
                  share_kv=cfg.sharing == "kv", one_kv_head=False)
    module = LinformerSelfAttention(**kwargs)
    return module, kwargs, module


def _natten(cfg: Any, ctx: MixerContext) -> Reference:
    """natten neighbourhood attention on the grid (prefix tokens have no place in it)."""
    if ctx.num_prefix:
        raise ReferenceUnavailable("natten has no prefix tokens (use --layer-prefix 0)")
    from natten import NeighborhoodAttention2D  # optional extra: imported only once known to be installed

    (H, W), C = ctx.grid, ctx.dim
    kwargs = dict(embed_dim=C, num_heads=ctx.num_heads, qkv_bias=ctx.qkv_bias, dilation=_option(cfg, "dilation", 1),
                  kernel_size=cfg.kernel_size)
    module = NeighborhoodAttention2D(**kwargs)

    def forward(x):
        return module(x.reshape(x.shape[0], H, W, C)).reshape(x.shape[0], H * W, C)  # [B, H, W, C] <-> [B, N, C]

    return module, kwargs, forward


_LAYER_BUILDERS = {"performer": _performer, "linformer": _linformer, "local": _natten, "dilated": _natten}


def layer_reference(name: str, attn: nn.Module, ctx: MixerContext) -> Reference:
    """The reference layer for vitzoo backend ``name``, built like ``attn``.

    Args:
        name: the vitzoo backend (a key of :data:`LAYER_REFERENCES`).
        attn: the vitzoo layer; its ``cfg`` gives the options to mirror.
        ctx: the layer's context (channels, heads, grid, prefix tokens, qkv bias).

    Returns:
        ``(module, kwargs it was built with, forward)`` where ``forward(x[B, N, C]) -> [B, N, C]``.

    Raises:
        ReferenceUnavailable: no reference for this backend, or its package is not installed.
    """
    if name not in LAYER_REFERENCES:
        raise ReferenceUnavailable(f"no reference implementation for {name}")
    if package_version(LAYER_REFERENCES[name][0]) is None:
        raise ReferenceUnavailable(NOT_INSTALLED)
    return _LAYER_BUILDERS[name](attn.cfg, ctx)


def reference_status(name: str) -> str:
    """"installed", :data:`NOT_INSTALLED` or "none" for the layer-level reference of backend ``name``.

    Args:
        name: a vitzoo backend.
    """
    if name not in LAYER_REFERENCES:
        return "none"
    return "installed" if package_version(LAYER_REFERENCES[name][0]) else NOT_INSTALLED
