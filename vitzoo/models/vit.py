"""Vision Transformer, DeiT-style, with a token mixer chosen by name.

Papers: Dosovitskiy et al., "An Image is Worth 16x16 Words", https://arxiv.org/abs/2010.11929;
Touvron et al., "Training data-efficient image transformers" (DeiT), https://arxiv.org/abs/2012.12877.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Optional

import torch
from timm.layers import PatchEmbed, resample_abs_pos_embed, trunc_normal_
from torch import Tensor, nn

from vitzoo.attention import MixerContext, attention_class, attention_config
from vitzoo.attention.base import check
from vitzoo.costs import Saved, layernorm_flops
from vitzoo.layers.block import Block
from vitzoo.layers.checkpointing import run_block
from vitzoo.layers.mimetic import apply_mimetic_init
from vitzoo.layers.saved import dropout_memory, head_memory, layernorm_memory, patchify_memory, prefixed
from vitzoo.layers.stem import ConvStem, sincos_pos_embed
from vitzoo.layers.token_reduction import attach_reducers, check_backend, reduction_config, sequence_grid
from vitzoo.models.factory import check_ranges, register_model


@dataclass
class ViTConfig:
    img_size: int = 224  # input side in pixels
    patch_size: int = 16  # patch side; img_size must be a multiple
    in_chans: int = 3  # input channels
    num_classes: int = 1000  # classifier outputs
    embed_dim: int = 192  # channels C
    depth: int = 12  # number of blocks
    num_heads: int = 3  # attention heads; embed_dim must be a multiple
    mlp_ratio: float = 4.0  # MLP hidden width / C
    qkv_bias: bool = True  # bias in the q/k/v projection
    class_token: bool = True  # prepend a class token (a prefix token every backend handles)
    global_pool: str = "token"  # "token" (class token) or "avg" (mean of grid tokens)
    stem: str = "patch"  # "patch": one p×p convolution (ViT); "conv": 3×3 stride-2 convs + BatchNorm (Xiao et al.)
    stem_full_res_convs: int = 0  # stem=conv: 3×3 stride-1 convs at full resolution before the stride-2 ones
    pos_embed: str = "learned"  # "learned" position embeddings, or "sincos": fixed 2-D sin-cos (Beyer et al.)
    attn_init: str = "default"  # "default": truncated normal; "mimetic": q/k/v like trained layers (Trockman & Kolter)
    window_size: int = 7  # natural window side for windowed backends that leave theirs null
    drop_rate: float = 0.0  # dropout in MLP and before the head
    attn_drop_rate: float = 0.0  # dropout on attention weights
    drop_path_rate: float = 0.1  # stochastic depth, linearly increasing over blocks
    norm_eps: float = 1e-5  # LayerNorm epsilon (timm's ViT/DeiT use 1e-6: model.pretrained sets it from the source)
    token_reduction: Any = None  # None, "tome", "evit", "tokenlearner" or {"name": ..., **options}
    grad_checkpointing: bool = False  # recompute each block in backward (training): less activation memory, more time

    def __post_init__(self):
        check_ranges(self)  # types and ranges first: nothing is allocated for a bad number
        check(self.img_size % self.patch_size == 0,
              f"model.img_size ({self.img_size}) must be divisible by model.patch_size ({self.patch_size})")
        check(self.embed_dim % self.num_heads == 0,
              f"model.embed_dim ({self.embed_dim}) must be divisible by model.num_heads ({self.num_heads})")
        check(
            self.global_pool in ("token", "avg"),
            f"model.global_pool must be 'token' or 'avg' (got {self.global_pool!r})",
        )
        check(self.class_token or self.global_pool == "avg", "model.global_pool='token' needs model.class_token=true")
        check(self.stem in ("patch", "conv"), f"model.stem must be 'patch' or 'conv' (got {self.stem!r})")
        check(isinstance(self.grad_checkpointing, bool),
              f"model.grad_checkpointing must be true or false (got {self.grad_checkpointing!r})")
        check(self.stem == "conv" or self.stem_full_res_convs == 0, "model.stem_full_res_convs needs model.stem=conv")
        check(
            self.pos_embed in ("learned", "sincos"),
            f"model.pos_embed must be 'learned' or 'sincos' (got {self.pos_embed!r})",
        )
        check(
            self.attn_init in ("default", "mimetic"),
            f"model.attn_init must be 'default' or 'mimetic' (got {self.attn_init!r})",
        )


class VisionTransformer(nn.Module):
    """ViT with a registry-selected token mixer in every block.

    Args:
        cfg: architecture (:class:`ViTConfig`).
        attention: attention spec, ``"global"``, ``{"name": ..., **options}`` or a config instance;
            validated once into ``self.attention_cfg``. None: :attr:`natural_attention`.
    """

    family = "vit"  # family name (vitzoo.bench's timm references are keyed by it)
    config_class = ViTConfig
    natural_attention = "global"  # what create_model("vit_*") builds when no attention is given

    def __init__(self, cfg: ViTConfig, attention: Any = None):
        super().__init__()
        self.cfg = cfg
        self.attention_cfg = attention_config(self.natural_attention if attention is None else attention)
        self.grad_checkpointing = cfg.grad_checkpointing  # timm's attribute: checkpoint every block in training
        C = cfg.embed_dim
        if cfg.stem == "conv":
            self.patch_embed = ConvStem(cfg.img_size, cfg.patch_size, cfg.in_chans, C, cfg.stem_full_res_convs)
        else:
            self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, C, strict_img_size=False)
        self.grid = tuple(self.patch_embed.grid_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, C)) if cfg.class_token else None
        # persistent prefix tokens the backend asks for beyond the class token (longformer's global tokens)
        extra = max(0, attention_class(self.attention_cfg).prefix_tokens(self.attention_cfg) - int(cfg.class_token))
        self.global_tokens = nn.Parameter(torch.zeros(1, extra, C)) if extra else None
        self.num_prefix = int(cfg.class_token) + extra
        if cfg.pos_embed == "sincos":  # fixed: a buffer, rebuilt for another grid (not in the state dict)
            self.register_buffer("pos_embed", sincos_pos_embed(self.grid, C, self.num_prefix), persistent=False)
        else:
            self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix + self.grid[0] * self.grid[1], C))
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        dpr = torch.linspace(0, cfg.drop_path_rate, cfg.depth, device="cpu").tolist()  # cpu: builds on meta too
        self.blocks = nn.ModuleList(
            [
                Block(
                    self.attention_cfg,
                    MixerContext(
                        C,
                        cfg.num_heads,
                        self.grid,
                        self.num_prefix,
                        cfg.qkv_bias,
                        cfg.attn_drop_rate,
                        cfg.drop_rate,
                        i,
                        cfg.window_size,
                        shifted=i % 2 == 1,
                    ),
                    cfg.mlp_ratio,
                    drop=cfg.drop_rate,
                    drop_path=dpr[i],
                    norm_eps=cfg.norm_eps,
                )
                for i in range(cfg.depth)
            ]
        )
        self.reduction = reduction_config(cfg.token_reduction)
        if self.reduction is not None:
            check_backend(self.reduction, self.attention_cfg, cfg.class_token)
            attach_reducers(self.reduction, self.attention_cfg, self.blocks, self.num_prefix)
        self.norm = nn.LayerNorm(C, eps=cfg.norm_eps)
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = nn.Linear(C, cfg.num_classes)
        if cfg.pos_embed == "learned":
            trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        if self.global_tokens is not None:
            trunc_normal_(self.global_tokens, std=0.02)
        init_weights(self)
        if cfg.attn_init == "mimetic":  # every q/k/v backend; the other mixers keep their own init
            apply_mimetic_init(self)

    def token_grid(self, img_hw: tuple[int, int]) -> tuple[int, int]:
        p = self.cfg.patch_size
        return img_hw[0] // p, img_hw[1] // p

    def forward_features(self, x: Tensor) -> Tensor:
        """``x[B, 3, H, W] -> tokens[B, P + H/p·W/p, C]`` after the final norm."""
        grid = self.token_grid(x.shape[-2:])
        x = self.patch_embed(x)  # [B, h·w, C]
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.global_tokens) if t is not None]
        if prefix:  # class token, then the backend's global tokens
            x = torch.cat([*prefix, x], dim=1)  # [B, P + h·w, C]
        pos = self.pos_embed
        if grid != self.grid and self.cfg.pos_embed == "sincos":
            pos = sincos_pos_embed(grid, self.cfg.embed_dim, self.num_prefix).to(x)
        elif grid != self.grid:
            pos = resample_abs_pos_embed(pos, list(grid), list(self.grid), num_prefix_tokens=self.num_prefix)
        x = self.pos_drop(x + pos)
        size = None if self.reduction is None else x.new_ones(x.shape[0], x.shape[1], 1)  # patches per token
        for blk in self.blocks:
            if blk.reducer is None:
                x = run_block(blk, x, grid, enabled=self.grad_checkpointing)
            else:  # fewer tokens after it: a sequence, grid (1, N − P)
                x, grid, size = blk.reducer(blk, x, grid, size)
        return self.norm(x)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """timm's switch for :attr:`grad_checkpointing`: in training, every block without a token reduction
        runs its forward again in backward instead of keeping its activations (:mod:`vitzoo.layers.checkpointing`).

        Args:
            enable: checkpoint the blocks (False: keep every activation).
        """
        self.grad_checkpointing = self.cfg.grad_checkpointing = bool(enable)

    def forward_head(self, x: Tensor) -> Tensor:
        x = x[:, 0] if self.cfg.global_pool == "token" else x[:, self.num_prefix :].mean(dim=1)
        return self.head(self.head_drop(x))

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Parameter groups in depth order (timm's convention: embeddings, each block, final norm last);
        timm's layer-wise lr decay (``param_groups_layer_decay``) reads it."""
        return {
            "stem": r"^cls_token|^global_tokens|^pos_embed|^patch_embed",
            "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        }

    def flops(self, img_size: Optional[int] = None) -> int:
        """Analytic MACs for one image (fvcore conventions: LayerNorm 5/elem, pooling 0)."""
        s = img_size or self.cfg.img_size
        grid = self.token_grid((s, s))
        C, n_grid = self.cfg.embed_dim, grid[0] * grid[1]
        if isinstance(self.patch_embed, ConvStem):
            total = self.patch_embed.flops(grid)
        else:
            total = n_grid * C * self.cfg.in_chans * self.cfg.patch_size**2  # patch conv: per token C·3·p²
        for blk, blk_grid in zip(self.blocks, self.block_grids(grid)):
            total += blk.flops(blk_grid)
        n = self.num_prefix + math.prod(self.out_grid(grid))
        total += layernorm_flops(n * C)  # final norm
        return total + C * self.cfg.num_classes  # head

    def memory(self, batch: int = 1, amp: Optional[torch.dtype] = None, grid: Optional[tuple[int, int]] = None,
               checkpointing: Optional[bool] = None) -> list[Saved]:
        """The tensors one training forward (image to logits, no loss) keeps for backward, each storage once,
        as :class:`~vitzoo.measure.activations.SavedTensorCounter` counts activation bytes on CPU: the stem,
        every block's :meth:`~vitzoo.layers.block.Block.memory`, the final norm and the head. Names carry the
        module path (``"blocks.0.attn: qkv input"``). The residual stream is fp32 under autocast too: the
        class token and the position embedding are fp32 parameters.

        Args:
            batch: images in the step.
            amp: autocast dtype (``torch.bfloat16``) or ``None`` for fp32.
            grid: token grid (default: the construction grid; another one resamples the position embedding,
                which keeps nothing).
            checkpointing: blocks run under activation checkpointing, keeping only their input (default:
                :attr:`grad_checkpointing`); blocks with a token reduction never are.

        Raises:
            NotImplementedError: a mixer or token reduction has no memory formula.
        """
        grid = tuple(grid or self.grid)
        ckpt = self.grad_checkpointing if checkpointing is None else checkpointing
        C, p = self.cfg.embed_dim, self.cfg.patch_size
        if isinstance(self.patch_embed, ConvStem):
            items = prefixed("patch_embed", self.patch_embed.memory(grid, batch, amp))
        else:
            image = (grid[0] * p, grid[1] * p)
            items = prefixed("patch_embed", patchify_memory(batch, self.cfg.in_chans, image, C, p, amp))
        rows = batch * (self.num_prefix + grid[0] * grid[1])  # [B, P + H·W, C] after the class token
        items += dropout_memory("pos_drop", self.cfg.drop_rate, rows * C, 4)
        for i, (blk, blk_grid) in enumerate(zip(self.blocks, self.block_grids(grid))):
            rows = batch * blk.attn.seq_len(blk_grid)
            if ckpt and blk.reducer is None:  # the checkpoint keeps the block's input [B, N, C]
                items.append(Saved(f"blocks.{i}: input (checkpoint)", rows * C, 4))
            else:
                items += prefixed(f"blocks.{i}", blk.memory(blk_grid, batch, amp))
        rows = batch * (self.num_prefix + math.prod(self.out_grid(grid)))
        items += prefixed("norm", layernorm_memory(rows, C, 4))  # [B, N, C]
        pooled = rows * C if self.cfg.global_pool == "token" else batch * C  # x[:, 0] views the norm's output
        return items + head_memory(batch, self.head, amp, self.cfg.drop_rate, 4, pooled)

    def flops_children(self, img_size: Optional[int] = None) -> Iterator[tuple[str, nn.Module, Any]]:
        """The parts :meth:`flops` sums, each with what its cost depends on (for a breakdown).

        Args:
            img_size: input side in pixels (default: the model's).

        Yields:
            ``(name, module, size)``: the token grid for the patch embedding and the blocks, the
            token count for the final norm (prefix + grid tokens) and the head (1: the pooled token).
        """
        s = img_size or self.cfg.img_size
        grid = self.token_grid((s, s))
        yield "patch_embed", self.patch_embed, grid
        for i, (blk, blk_grid) in enumerate(zip(self.blocks, self.block_grids(grid))):
            yield f"blocks.{i}", blk, blk_grid
        yield "norm", self.norm, self.num_prefix + math.prod(self.out_grid(grid))
        yield "head", self.head, 1

    def block_grids(self, grid: tuple[int, int]) -> list[tuple[int, int]]:
        """The grid each block runs at: ``grid``, then ``(1, N − P)`` after a token reduction."""
        grids = [grid]
        for blk in self.blocks[:-1]:
            grids.append(self.after(blk, grids[-1]))
        return grids

    def out_grid(self, grid: tuple[int, int]) -> tuple[int, int]:
        """The grid of the tokens the last block returns."""
        return self.after(self.blocks[-1], self.block_grids(grid)[-1])

    def after(self, blk: Block, grid: tuple[int, int]) -> tuple[int, int]:
        if blk.reducer is None:
            return grid
        return sequence_grid(blk.reducer.reduced(self.num_prefix + grid[0] * grid[1]), self.num_prefix)


@register_model(VisionTransformer)
def vit_tiny() -> dict[str, Any]:
    """DeiT-T (ViT-Ti/16), 224 px: 5.7M params, 1.26 GMACs."""
    return dict(embed_dim=192, depth=12, num_heads=3)


@register_model(VisionTransformer)
def vit_small() -> dict[str, Any]:
    """DeiT-S (ViT-S/16), 224 px: 22M params, 4.6 GMACs."""
    return dict(embed_dim=384, depth=12, num_heads=6)


@register_model(VisionTransformer)
def vit_base() -> dict[str, Any]:
    """DeiT-B / ViT-B/16, 224 px: 86M params, 17.6 GMACs."""
    return dict(embed_dim=768, depth=12, num_heads=12)


@register_model(VisionTransformer)
def vit_cifar() -> dict[str, Any]:
    """Small ViT for 32 px images (CIFAR, digits): patch 4 -> 8x8 tokens + class token."""
    return dict(
        img_size=32,
        patch_size=4,
        num_classes=10,
        embed_dim=192,
        depth=6,
        num_heads=3,
        mlp_ratio=2.0,
        window_size=4,
        drop_path_rate=0.1,
    )


def init_weights(model: nn.Module) -> None:
    """timm/DeiT init for Linear and LayerNorm, then each mixer's own ``init_weights()`` if it has one."""
    model.apply(_init_weights)
    for m in model.modules():
        if m is not model and hasattr(m, "init_weights"):
            m.init_weights()


def _init_weights(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)
