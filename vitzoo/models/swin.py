"""Swin Transformer with a token mixer chosen by name.

Paper: Liu et al., "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows",
ICCV 2021, https://arxiv.org/abs/2103.14030.

With ``attention=window`` this is Swin (W-MSA / SW-MSA alternating). With any other backend each
stage's blocks apply that backend to all tokens of the stage (no windows): a hierarchical
backbone with, e.g., Performer or Linformer attention.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from timm.layers import PatchEmbed
from torch import Tensor, nn

from vitzoo.attention import MixerContext, attention_config
from vitzoo.attention.base import check
from vitzoo.costs import Saved, itemsize, layernorm_flops
from vitzoo.layers.block import Block
from vitzoo.layers.checkpointing import run_block
from vitzoo.layers.saved import head_memory, layernorm_memory, linear_memory, patchify_memory, prefixed
from vitzoo.layers.token_reduction import REDUCTIONS, reduction_config
from vitzoo.models.factory import check_ranges, register_model
from vitzoo.models.vit import init_weights


@dataclass
class SwinConfig:
    img_size: int = 224  # input side in pixels
    patch_size: int = 4  # patch partition side; img_size must be a multiple
    in_chans: int = 3  # input channels
    num_classes: int = 1000  # classifier outputs
    embed_dim: int = 96  # channels C of stage 1 (doubles every stage)
    depths: list[int] = field(default_factory=lambda: [2, 2, 6, 2])  # blocks per stage
    num_heads: list[int] = field(default_factory=lambda: [3, 6, 12, 24])  # heads per stage
    window_size: int = 7  # natural window side M (used by attention=window unless it sets its own)
    mlp_ratio: float = 4.0  # MLP hidden width / C
    qkv_bias: bool = True  # bias in the q/k/v projection
    drop_rate: float = 0.0  # dropout in MLP and before the head
    attn_drop_rate: float = 0.0  # dropout on attention weights
    drop_path_rate: float = 0.2  # stochastic depth, linearly increasing over all blocks
    norm_eps: float = 1e-5  # LayerNorm epsilon (Swin's and timm's: 1e-5; model.pretrained sets it from the source)
    token_reduction: Any = None  # must stay None: patch merging needs every token of the grid (ViT only)
    grad_checkpointing: bool = False  # recompute each block in backward (training): less activation memory, more time

    def __post_init__(self):
        check_ranges(self)  # types and ranges first: nothing is allocated for a bad number
        self.depths, self.num_heads = list(self.depths), list(self.num_heads)
        check(isinstance(self.grad_checkpointing, bool),
              f"model.grad_checkpointing must be true or false (got {self.grad_checkpointing!r})")
        check(self.img_size % self.patch_size == 0,
              f"model.img_size ({self.img_size}) must be divisible by model.patch_size ({self.patch_size})")
        check(
            len(self.depths) == len(self.num_heads),
            f"model.depths ({len(self.depths)} stages) and model.num_heads ({len(self.num_heads)}) "
            "must have the same length",
        )
        for i, h in enumerate(self.num_heads):
            check(
                (self.embed_dim * 2**i) % h == 0,
                f"model.num_heads[{i}]={h} must divide stage {i} channels {self.embed_dim * 2**i} "
                f"(model.embed_dim·2^{i})",
            )


class PatchMerging(nn.Module):
    """2×2 neighbouring tokens concatenated (4C), normalised and projected to 2C; odd grids are padded."""

    def __init__(self, dim: int, norm_eps: float = 1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim, eps=norm_eps)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    @staticmethod
    def out_grid(grid: tuple[int, int]) -> tuple[int, int]:
        return (grid[0] + 1) // 2, (grid[1] + 1) // 2

    def forward(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        B, _, C = x.shape
        H, W = grid
        x = x.view(B, H, W, C)
        if H % 2 or W % 2:
            x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))  # [B, H', W', C] even sides
        h, w = PatchMerging.out_grid(grid)
        x = x.view(B, h, 2, w, 2, C).permute(0, 1, 3, 4, 2, 5)  # [B, H/2, W/2, 2 (col), 2 (row), C]
        x = x.reshape(B, h * w, 4 * C)  # channels: (0,0), (1,0), (0,1), (1,1) neighbours (row, col), as timm
        return self.reduction(self.norm(x))  # [B, H/2·W/2, 2C]

    def flops(self, grid: tuple[int, int]) -> int:
        h, w = self.out_grid(grid)
        c4 = self.reduction.in_features
        return layernorm_flops(h * w * c4) + h * w * c4 * self.reduction.out_features  # norm + linear 4C->2C

    formula = "5N'·4C + N'·4C·2C"  # norm over 4C + reduction 4C -> 2C, at N' merged tokens

    def memory(self, grid: tuple[int, int], batch: int = 1, amp: Optional[torch.dtype] = None) -> list[Saved]:
        """The norm's input (the gathered ``[B, N', 4C]`` copy in the stream's dtype) and row statistics; the
        reduction's input and weight copy. Args: ``grid`` the input grid, ``batch``, ``amp`` (or ``None``)."""
        rows, c4 = batch * self.out_grid(grid)[0] * self.out_grid(grid)[1], self.reduction.in_features
        items = prefixed("norm", layernorm_memory(rows, c4, itemsize(amp)))  # [B, N', 4C], [B, N', 1] twice
        return items + linear_memory("reduction", rows * c4, self.reduction.out_features * c4, amp)

    def symbols(self, grid: tuple[int, int]) -> dict[str, int]:
        """Values of the symbols of :attr:`formula` at input ``grid``: N' merged tokens, C input channels."""
        h, w = self.out_grid(grid)
        return {"N'": h * w, "C": self.reduction.in_features // 4}


class SwinStage(nn.Module):
    """Blocks at one resolution (odd blocks built ``shifted``: SW-MSA with window attention),
    then optional patch merging."""

    def __init__(
        self,
        attention: Any,
        dim: int,
        depth: int,
        num_heads: int,
        grid: tuple[int, int],
        cfg: SwinConfig,
        drop_path: list[float],
        first_layer: int,
        downsample: bool,
    ):
        super().__init__()
        self.grid = grid
        self.blocks = nn.ModuleList(
            [
                Block(
                    attention,
                    MixerContext(
                        dim,
                        num_heads,
                        grid,
                        0,
                        cfg.qkv_bias,
                        cfg.attn_drop_rate,
                        cfg.drop_rate,
                        first_layer + i,
                        cfg.window_size,
                        shifted=i % 2 == 1,
                    ),
                    cfg.mlp_ratio,
                    drop=cfg.drop_rate,
                    drop_path=drop_path[i],
                    norm_eps=cfg.norm_eps,
                )
                for i in range(depth)
            ]
        )
        self.downsample = PatchMerging(dim, cfg.norm_eps) if downsample else None
        self.grad_checkpointing = cfg.grad_checkpointing  # checkpoint every block in training (timm's name)

    def forward(self, x: Tensor, grid: tuple[int, int]) -> tuple[Tensor, tuple[int, int]]:
        for blk in self.blocks:
            x = run_block(blk, x, grid, enabled=self.grad_checkpointing)
        if self.downsample is None:
            return x, grid
        return self.downsample(x, grid), PatchMerging.out_grid(grid)

    def flops(self, grid: tuple[int, int]) -> int:
        total = sum(blk.flops(grid) for blk in self.blocks)
        return total + (self.downsample.flops(grid) if self.downsample is not None else 0)

    formula = "Σ blocks + downsample"  # how flops() is composed (shown in FLOPs breakdowns)

    def memory(self, grid: tuple[int, int], batch: int = 1, amp: Optional[torch.dtype] = None,
               checkpointing: Optional[bool] = None) -> list[Saved]:
        """Every block's :meth:`~vitzoo.layers.block.Block.memory` (its input alone under ``checkpointing``,
        default :attr:`grad_checkpointing`), then the merge's. Args as :meth:`SwinTransformer.memory`."""
        ckpt = self.grad_checkpointing if checkpointing is None else checkpointing
        size, items = itemsize(amp), []  # the stream: fp32, or the autocast dtype from the patch norm on
        for i, blk in enumerate(self.blocks):
            if ckpt:  # the checkpoint keeps the block's input [B, H·W, C]
                items.append(Saved(f"blocks.{i}: input (checkpoint)", batch * grid[0] * grid[1] * blk.attn.dim, size))
            else:
                items += prefixed(f"blocks.{i}", blk.memory(grid, batch, amp, stream=size))
        if self.downsample is not None:
            items += prefixed("downsample", self.downsample.memory(grid, batch, amp))
        return items

    def flops_children(self, grid: tuple[int, int]) -> Iterator[tuple[str, nn.Module, Any]]:
        """The parts :meth:`flops` sums, each at the stage's input ``grid`` (for a breakdown).

        Args:
            grid: token grid (H, W) the stage runs at.
        """
        for i, blk in enumerate(self.blocks):
            yield f"blocks.{i}", blk, grid
        if self.downsample is not None:
            yield "downsample", self.downsample, grid


class SwinTransformer(nn.Module):
    """Hierarchical backbone: patch partition, stages with patch merging, norm, mean pool, head.

    Args:
        cfg: architecture (:class:`SwinConfig`).
        attention: attention spec used in every block of every stage (``"window"``, ``{"name": ...,
            **options}`` or a config instance); validated once into ``self.attention_cfg``.
            None: :attr:`natural_attention`.
    """

    family = "swin"  # family name (vitzoo.bench's timm references are keyed by it)
    config_class = SwinConfig
    natural_attention = "window"  # what create_model("swin_*") builds when no attention is given: real Swin

    def __init__(self, cfg: SwinConfig, attention: Any = None):
        super().__init__()
        self.cfg = cfg
        self.attention_cfg = attention_config(self.natural_attention if attention is None else attention)
        reduction = reduction_config(cfg.token_reduction)
        check(reduction is None, f"model.token_reduction={REDUCTIONS.name_of(reduction) if reduction else ''} needs a "
                                 "ViT: Swin's patch merging needs the full token grid; use model=vit_cifar or "
                                 "model.token_reduction=null")
        self.num_prefix = 0
        self.patch_embed = PatchEmbed(
            cfg.img_size,
            cfg.patch_size,
            cfg.in_chans,
            cfg.embed_dim,
            norm_layer=partial(nn.LayerNorm, eps=cfg.norm_eps),
            strict_img_size=False,
        )
        dpr = torch.linspace(0, cfg.drop_path_rate, sum(cfg.depths), device="cpu").tolist()  # cpu: builds on meta too
        grid, stages = tuple(self.patch_embed.grid_size), []
        for i, (depth, heads) in enumerate(zip(cfg.depths, cfg.num_heads)):
            first = sum(cfg.depths[:i])
            last = i == len(cfg.depths) - 1
            stages.append(
                SwinStage(
                    self.attention_cfg,
                    cfg.embed_dim * 2**i,
                    depth,
                    heads,
                    grid,
                    cfg,
                    dpr[first : first + depth],
                    first,
                    downsample=not last,
                )
            )
            grid = grid if last else PatchMerging.out_grid(grid)
        self.stages = nn.ModuleList(stages)
        self.num_features = cfg.embed_dim * 2 ** (len(cfg.depths) - 1)
        self.norm = nn.LayerNorm(self.num_features, eps=cfg.norm_eps)
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = nn.Linear(self.num_features, cfg.num_classes)
        init_weights(self)

    def forward_features(self, x: Tensor) -> Tensor:
        """``x[B, 3, H, W] -> tokens[B, h·w, C_last]`` after the final norm."""
        p = self.cfg.patch_size
        grid = (x.shape[-2] // p, x.shape[-1] // p)
        x = self.patch_embed(x)  # [B, h·w, C]
        for stage in self.stages:
            x, grid = stage(x, grid)
        return self.norm(x)

    @property
    def grad_checkpointing(self) -> bool:
        """Whether every block runs its forward again in backward during training (timm's attribute)."""
        return self.cfg.grad_checkpointing

    @grad_checkpointing.setter
    def grad_checkpointing(self, enable: bool) -> None:
        self.set_grad_checkpointing(enable)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """timm's switch for :attr:`grad_checkpointing`: in training, every block of every stage runs its
        forward again in backward instead of keeping its activations (:mod:`vitzoo.layers.checkpointing`).

        Args:
            enable: checkpoint the blocks (False: keep every activation).
        """
        self.cfg.grad_checkpointing = bool(enable)
        for stage in self.stages:
            stage.grad_checkpointing = bool(enable)

    def forward_head(self, x: Tensor) -> Tensor:
        return self.head(self.head_drop(x.mean(dim=1)))

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    def group_matcher(self, coarse: bool = False) -> Callable[[str], tuple[float, ...]]:
        """Depth ordinal of a parameter name, as timm's Swin orders its layers (timm's layer-wise lr decay,
        ``param_groups_layer_decay``, reads it): patch embedding, then blocks; a patch merging belongs
        to the first block after it (timm merges at the start of a stage, vitzoo at the end of the one
        before); the final norm joins the last block (ordinal 99999); the head comes last."""

        def ordinal(name: str) -> tuple[float, ...]:
            if name.startswith("patch_embed"):
                return (0,)
            if m := re.match(r"^stages\.(\d+)\.(blocks\.(\d+)|downsample)", name):
                stage = int(m[1]) + (m[3] is None)  # downsample: with block 0 of the next stage
                return (1, stage) if coarse else (1, stage, int(m[3] or 0))
            return (99999,) if name.startswith("norm") else (float("inf"),)

        return ordinal

    def flops(self, img_size: Optional[int] = None) -> int:
        """Analytic MACs for one image (fvcore conventions: LayerNorm 5/elem, pooling 0)."""
        s = img_size or self.cfg.img_size
        grid = (s // self.cfg.patch_size, s // self.cfg.patch_size)
        C = self.cfg.embed_dim
        total = grid[0] * grid[1] * C * (self.cfg.in_chans * self.cfg.patch_size**2)  # patch conv
        total += layernorm_flops(grid[0] * grid[1] * C)  # patch norm
        for stage in self.stages:
            total += stage.flops(grid)
            grid = grid if stage.downsample is None else PatchMerging.out_grid(grid)
        total += layernorm_flops(grid[0] * grid[1] * self.num_features)  # final norm
        return total + self.num_features * self.cfg.num_classes  # head

    def memory(self, batch: int = 1, amp: Optional[torch.dtype] = None, grid: Optional[tuple[int, int]] = None,
               checkpointing: Optional[bool] = None) -> list[Saved]:
        """The tensors one training forward (image to logits, no loss) keeps for backward, each storage once, as
        :class:`~vitzoo.measure.activations.SavedTensorCounter` counts activation bytes on CPU (names carry the
        module path). Under autocast the residual stream is in the autocast dtype (the patch norm keeps its input's).

        Args:
            batch: images in the step; amp: autocast dtype or ``None`` for fp32.
            grid: token grid of the first stage (default: the construction grid).
            checkpointing: blocks keep only their input (default: :attr:`grad_checkpointing`).

        Raises:
            NotImplementedError: the mixer has no memory formula.
        """
        p, C, size = self.cfg.patch_size, self.cfg.embed_dim, itemsize(amp)
        grid = tuple(grid or self.patch_embed.grid_size)
        image = (grid[0] * p, grid[1] * p)
        items = prefixed("patch_embed", patchify_memory(batch, self.cfg.in_chans, image, C, p, amp))
        items += prefixed("patch_embed.norm", layernorm_memory(batch * grid[0] * grid[1], C, size))  # [B, H·W, C]
        for i, stage in enumerate(self.stages):
            items += prefixed(f"stages.{i}", stage.memory(grid, batch, amp, checkpointing))
            grid = grid if stage.downsample is None else PatchMerging.out_grid(grid)
        items += prefixed("norm", layernorm_memory(batch * grid[0] * grid[1], self.num_features, size))
        return items + head_memory(batch, self.head, amp, self.cfg.drop_rate, size, batch * self.num_features)

    def flops_children(self, img_size: Optional[int] = None) -> Iterator[tuple[str, nn.Module, Any]]:
        """The parts :meth:`flops` sums, each with what its cost depends on (for a breakdown).

        Args:
            img_size: input side in pixels (default: the model's).

        Yields:
            ``(name, module, size)``: the token grid for the patch embedding and each stage (its
            input grid), the token count for the final norm and the head (1: the pooled token).
        """
        s = img_size or self.cfg.img_size
        grid = (s // self.cfg.patch_size, s // self.cfg.patch_size)
        yield "patch_embed", self.patch_embed, grid
        for i, stage in enumerate(self.stages):
            yield f"stages.{i}", stage, grid
            grid = grid if stage.downsample is None else PatchMerging.out_grid(grid)
        yield "norm", self.norm, grid[0] * grid[1]
        yield "head", self.head, 1


@register_model(SwinTransformer)
def swin_tiny() -> dict[str, Any]:
    """Swin-T, 224 px: 28M params, 4.5 GMACs (SwinConfig's defaults)."""
    return dict(embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24])


@register_model(SwinTransformer)
def swin_small() -> dict[str, Any]:
    """Swin-S, 224 px: 50M params, 8.7 GMACs."""
    return dict(embed_dim=96, depths=[2, 2, 18, 2], num_heads=[3, 6, 12, 24], drop_path_rate=0.3)


@register_model(SwinTransformer)
def swin_base() -> dict[str, Any]:
    """Swin-B, 224 px: 88M params, 15.4 GMACs."""
    return dict(embed_dim=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32], drop_path_rate=0.5)


@register_model(SwinTransformer)
def swin_cifar() -> dict[str, Any]:
    """Small Swin for 32 px images: patch 2 -> stages of 16x16, 8x8, 4x4 tokens."""
    return dict(
        img_size=32,
        patch_size=2,
        num_classes=10,
        embed_dim=64,
        depths=[2, 2, 2],
        num_heads=[2, 4, 8],
        window_size=4,
        mlp_ratio=2.0,
        drop_path_rate=0.1,
    )
