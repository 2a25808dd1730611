"""The pre-norm transformer block shared by ViT and Swin: ``x + mix(norm(x))``, ``x + mlp(norm(x))``."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional

import torch
from timm.layers import DropPath, Mlp
from torch import Tensor, nn

from vitzoo.attention import MixerContext, build_attention
from vitzoo.attention.base import Grid
from vitzoo.costs import Saved, itemsize, layernorm_flops
from vitzoo.layers.saved import drop_path_memory, layernorm_memory, mlp_memory, prefixed


class Block(nn.Module):
    """Norm → token mixer (from the registry by name) → residual; norm → MLP → residual.

    Args:
        attention: attention spec (``"global"`` or ``{"name": ..., **options}``).
        ctx: dims, heads, grid, prefix tokens, layer index and shift (Swin's odd blocks) for the mixer.
        mlp_ratio: hidden width of the MLP relative to C.
        drop: dropout in the MLP; drop_path: stochastic depth rate.
        norm_eps: epsilon of both LayerNorms (timm's ViT/DeiT: 1e-6; Swin and torch's default: 1e-5).
    """

    formula = "norm1 + attn + norm2 + mlp"  # how flops() is composed (shown in FLOPs breakdowns)

    def __init__(self, attention: Any, ctx: MixerContext, mlp_ratio: float = 4.0, drop: float = 0.0,
                 drop_path: float = 0.0, norm_eps: float = 1e-5):
        super().__init__()
        self.norm1 = nn.LayerNorm(ctx.dim, eps=norm_eps)
        self.attn = build_attention(attention, ctx)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(ctx.dim, eps=norm_eps)
        self.mlp = Mlp(ctx.dim, int(ctx.dim * mlp_ratio), act_layer=nn.GELU, drop=drop)
        # token reduction (vitzoo.layers.token_reduction), set by the model: the model calls
        # ``reducer(block, x, grid, size)`` in place of the block, and flops() follows it
        self.reducer: Optional[nn.Module] = None

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), grid))
        return x + self.drop_path(self.mlp(self.norm2(x)))

    def flops(self, grid: Grid) -> int:
        if self.reducer is not None:  # the block with its reduction, from its N tokens
            return self.reducer.block_flops(self, grid, self.attn.seq_len(grid))
        return self.plain_flops(grid)

    def plain_flops(self, grid: Grid) -> int:
        """MACs of the block without reduction at ``grid``."""
        n = self.attn.seq_len(grid)
        mlp = n * self.mlp.fc1.in_features * self.mlp.fc1.out_features  # fc1: N·C·hidden
        mlp += n * self.mlp.fc2.in_features * self.mlp.fc2.out_features  # fc2: N·hidden·C
        return 2 * layernorm_flops(n * self.attn.dim) + self.attn.flops(grid) + mlp

    def memory(self, grid: Grid, batch: int = 1, amp: Optional[torch.dtype] = None, stream: int = 4) -> list[Saved]:
        """The tensors one training forward of the block keeps for backward (each storage once), as
        :class:`~vitzoo.measure.activations.SavedTensorCounter` counts them on CPU: both norms, the mixer's own
        :meth:`~vitzoo.attention.base.TokenMixer.memory`, the MLP and the drop-path masks. With a token
        reduction, its reducer's ``block_memory(block, grid, n, batch, amp)``.

        Args:
            grid: token grid the block runs at (prefix tokens on top).
            batch: images in the step.
            amp: autocast dtype or ``None`` for fp32.
            stream: bytes per element of the residual stream entering the block (the norms' inputs): 4 in the
                ViT, whose position embedding keeps it fp32; the autocast size in Swin under autocast. norm1 keeps
                it, so it is the mixer's input too (its ``memory(input_dtype=...)``).

        Raises:
            NotImplementedError: the mixer, or the reducer, has no memory formula.
        """
        if self.reducer is not None:
            block_memory = getattr(self.reducer, "block_memory", None)
            if block_memory is None:
                raise NotImplementedError(f"token reduction {type(self.reducer).__name__} has no block_memory()")
            return block_memory(self, grid, self.attn.seq_len(grid), batch, amp)
        return self.plain_memory(grid, batch, amp, stream)

    def plain_memory(self, grid: Grid, batch: int = 1, amp: Optional[torch.dtype] = None,
                     stream: int = 4) -> list[Saved]:
        """:meth:`memory` of the block without reduction (same arguments)."""
        rows, dim, size = batch * self.attn.seq_len(grid), self.attn.dim, itemsize(amp)
        # the mixer's output: the autocast dtype (its last op is a projection), or its input's dtype for the
        # mixers that declare ``keeps_input_dtype`` (the FFT mixers cast their result back to the input's)
        mixed = stream if getattr(self.attn, "keeps_input_dtype", False) else size
        items = prefixed("norm1", layernorm_memory(rows, dim, stream))  # [B, N, C] and [B, N, 1] twice
        input_dtype = amp if amp is not None and stream == size else None  # norm1 keeps the stream's dtype
        items += prefixed("attn", self.attn.memory(grid, batch=batch, amp=amp, input_dtype=input_dtype))
        items += drop_path_memory("drop_path (mixer)", self.drop_path, batch, mixed)  # [B, 1, 1]
        items += prefixed("norm2", layernorm_memory(rows, dim, stream))  # the residual sum keeps the stream's dtype
        items += prefixed("mlp", mlp_memory(self.mlp, rows, amp))
        return items + drop_path_memory("drop_path (mlp)", self.drop_path, batch, size)  # [B, 1, 1]

    def flops_children(self, grid: Grid) -> Iterator[tuple[str, nn.Module, Any]]:
        """The parts :meth:`flops` sums, each with what its cost depends on (for a breakdown).

        Args:
            grid: token grid (H, W) the block runs at.

        Yields:
            ``(name, module, size)``: the grid for the mixer, the token count N for norms and MLP.
        """
        if self.reducer is not None:  # the parts its reduction runs, each at its own token count
            yield from self.reducer.parts(self, grid, self.attn.seq_len(grid))
            return
        yield from self.plain_parts(grid)

    def plain_parts(self, grid: Grid) -> list[tuple[str, nn.Module, Any]]:
        """:meth:`flops_children` of the block without reduction at ``grid``."""
        n = self.attn.seq_len(grid)
        return [("norm1", self.norm1, n), ("attn", self.attn, grid), ("norm2", self.norm2, n), ("mlp", self.mlp, n)]
