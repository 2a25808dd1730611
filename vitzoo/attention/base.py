"""The token-mixer interface every attention backend implements.

Contract (one interface for every mixer):

* ``forward(x, grid)``: ``x[B, N, C]`` in, ``[B, N, C]`` out, ``N = P + H*W`` where ``P`` is the
  number of prefix tokens (ViT's class token) fixed at construction and ``grid = (H, W)``.
  Prefix tokens come first. There is no other call signature: a mixer that needs more (the
  window backend's shift, a fixed sequence length) gets it at construction through
  :class:`MixerContext`, and does its own geometry (padding, shifts, partitions) inside ``forward``.
* ``flops(grid)``: analytic multiply-adds for ONE image at token grid ``grid`` (fvcore's and the
  Swin paper's convention: a fused multiply-add counts 1; softmax, scaling, bias and mask adds,
  activations and reductions count 0). Each matmul is commented where it is counted.
* ``formula``: the cost as text, e.g. ``"4NC² + 2N²C"``, shown next to the numbers.
* ``memory(grid, batch, amp, input_dtype)``: the tensors a training forward keeps for backward
  (:class:`vitzoo.costs.Saved`, name, elements, bytes per element), exact against
  :class:`vitzoo.measure.activations.SavedTensorCounter` on CPU's default path, as ``flops`` is against fvcore.
  ``input_dtype`` is the dtype of the mixer's input: fp32 (``None``) in a ViT, whose residual stream stays fp32
  under autocast; the autocast dtype in Swin, whose stream autocast keeps in it. A backend whose saved set does
  not depend on it writes ``memory(grid, batch, amp)`` and the base accepts and ignores the argument for it.
* ``reference(x, grid)``: a plain, slow implementation of the same maths (explicit
  ``softmax(QKᵀ/√d)V`` with the pattern's mask for sparse backends) that tests compare against.
* ``before_train_step()``: per-step state, called once before every training step, outside ``forward``
  (:func:`vitzoo.attention.before_train_step` calls it for every mixer of a model). The default does
  nothing; random-feature backends count the step and redraw their features when due.

Capability flags are class attributes checked when the model is built:

* ``fixed_length``: parameters depend on the sequence length fixed at construction.
* ``linear_cost`` / ``linear_in(cfg, heads)``: cost grows linearly with N at fixed options (sparse, windowed, linear
  backends); ``linear_in`` answers for one config (``multi_pattern`` with global heads is quadratic).
* ``impls``: the values the config's ``impl`` option accepts (empty: the backend has one implementation).
* ``prefix_tokens(cfg)``: how many persistent prefix tokens (class token included) the host must carry
  (``longformer``'s persistent global tokens); 0 by default.
* ``sequence_capable`` / ``takes_sequence(cfg)``: the output depends on the tokens as a sequence only (no grid,
  windows, local pattern or fixed length), so the backend runs on a token-reduced sequence; ``takes_sequence``
  answers for one config (``relu_linear`` with multi-scale heads needs the grid).
* ``exposes_attention``: :meth:`TokenMixer.forward_with_keys` returns q and k and takes an additive key bias,
  so token reducers use the backend itself (ToMe's key similarity and size-weighted attention, EViT's
  class-token ranking) instead of a copy of it.

A backend's family is the subpackage its module lives in (:func:`vitzoo.attention.attention_family`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitzoo.costs import Saved, itemsize
from vitzoo.registry import ConfigError

Grid = tuple[int, int]



@dataclass(frozen=True)
class MixerContext:
    """What the host block tells a token mixer when it is built.

    Args:
        dim: channels C.
        num_heads: attention heads h (C must be divisible by h).
        grid: token grid (H, W) the layer is built for.
        num_prefix: prefix tokens P in front of the grid tokens (ViT class token: 1; Swin: 0).
        qkv_bias: bias in the q/k/v projection.
        attn_drop: dropout on attention weights (where a backend has them).
        proj_drop: dropout after the output projection.
        layer_index: index of the block in the network (seeds per-layer random patterns).
        window: the backbone's natural window side (Swin-T: 7); backends whose window/block option
            is ``None`` use it.
        shifted: the block is one of Swin's odd blocks (the window backend shifts its windows there).
    """

    dim: int
    num_heads: int
    grid: Grid
    num_prefix: int = 0
    qkv_bias: bool = True
    attn_drop: float = 0.0
    proj_drop: float = 0.0
    layer_index: int = 0
    window: int = 7
    shifted: bool = False


def check(condition: bool, message: str) -> None:
    """Raise a one-line :class:`ConfigError` when ``condition`` is false."""
    if not condition:
        raise ConfigError(message)


def check_positive(cfg: Any, *names: str) -> None:
    """Every ``attention.<name>`` listed must be a positive integer."""
    for name in names:
        value = getattr(cfg, name)
        check(isinstance(value, int) and value > 0, f"attention.{name} must be a positive integer (got {value!r})")


def check_non_negative(cfg: Any, *names: str) -> None:
    """Every ``attention.<name>`` listed must be an integer >= 0."""
    for name in names:
        value = getattr(cfg, name)
        check(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
              f"attention.{name} must be a non-negative integer (got {value!r})")


def check_positive_number(cfg: Any, *names: str) -> None:
    """Every ``attention.<name>`` listed must be a positive int or float (not a bool)."""
    for name in names:
        value = getattr(cfg, name)
        check(isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0,
              f"attention.{name} must be a positive number (got {value!r})")


class TokenMixer(nn.Module):
    """Base class of every registered token mixer (see the module docstring for the contract).

    Args:
        cfg: the backend's config dataclass (validated by its ``__post_init__``).
        ctx: the host's :class:`MixerContext`.
    """

    formula: ClassVar[str] = ""  # the one source of the cost text (scripts/gen_docs.py writes its copies)
    fixed_length: ClassVar[bool] = False
    linear_cost: ClassVar[bool] = False  # cost grows linearly in N (checked by tests 16x16 -> 64x64)
    impls: ClassVar[tuple[str, ...]] = ()  # values of the config's ``impl`` option (empty: no such option)
    sequence_capable: ClassVar[bool] = False  # runs on any token sequence (token reduction may precede it)
    exposes_attention: ClassVar[bool] = False  # forward_with_keys: q, k and an additive key bias (token reducers)
    flop_handles: ClassVar[dict] = {}  # extra fvcore op handles this backend needs, e.g. {"aten::fft_fft2": fn}
    registry_name: ClassVar[str]

    def __init__(self, cfg: Any, ctx: MixerContext):
        super().__init__()
        check(ctx.dim % ctx.num_heads == 0,
              f"model.embed_dim ({ctx.dim}) must be divisible by model.num_heads ({ctx.num_heads})")
        self.cfg = cfg
        self.dim = ctx.dim
        self.num_heads = ctx.num_heads
        self.head_dim = ctx.dim // ctx.num_heads
        self.scale = self.head_dim ** -0.5
        self.grid: Grid = tuple(ctx.grid)
        self.num_prefix = ctx.num_prefix
        self.layer_index = ctx.layer_index

    @classmethod
    def prefix_tokens(cls, cfg: Any) -> int:
        """Prefix tokens (the class token among them) the backend asks its host to carry through every block,
        prepended once at the input; a ViT adds learned tokens after its class token up to this count.
        0 (the default): no request.

        Args:
            cfg: the backend's config.
        """
        return 0

    @classmethod
    def takes_sequence(cls, cfg: Any) -> bool:
        """Whether this config of the backend runs on a plain token sequence (after token reduction):
        :attr:`sequence_capable` unless an option needs the grid.

        Args:
            cfg: the backend's config.
        """
        return cls.sequence_capable

    @classmethod
    def linear_in(cls, cfg: Any, num_heads: int) -> bool:
        """Whether this config's cost grows linearly in N: :attr:`linear_cost` unless an option adds a
        quadratic part (``multi_pattern`` with heads on its global pattern).

        Args:
            cfg: the backend's config; num_heads: the layer's heads.
        """
        return cls.linear_cost

    @property
    def grows_linearly(self) -> bool:
        """:meth:`linear_in` for this layer's config and heads."""
        return type(self).linear_in(self.cfg, self.num_heads)

    def seq_len(self, grid: Optional[Grid] = None) -> int:
        """N = P + H*W at ``grid`` (default: the construction grid)."""
        h, w = grid or self.grid
        return self.num_prefix + h * w

    def check_grid(self, grid: Grid) -> None:
        """Fixed-length mixers: a grid other than the construction grid needs ``interpolate: true``."""
        if self.fixed_length and tuple(grid) != self.grid and not getattr(self.cfg, "interpolate", False):
            raise ConfigError(
                f"attention={self.registry_name} is built for a {self.grid[0]}x{self.grid[1]} token grid, got "
                f"{grid[0]}x{grid[1]}; set attention.interpolate=true or keep model.img_size"
            )

    def forward(self, x: Tensor, grid: Grid) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def flops(self, grid: Optional[Grid] = None) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def reference(self, x: Tensor, grid: Grid) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def memory(self, grid: Optional[Grid] = None, batch: int = 1, amp: Optional[torch.dtype] = None,
               input_dtype: Optional[torch.dtype] = None) -> list[Saved]:  # pragma: no cover - abstract
        """The tensors one training forward of this mixer keeps for backward, each storage once: what
        :class:`vitzoo.measure.activations.SavedTensorCounter` counts as activation bytes inside it on CPU's
        default path (its input where an op saves it, autocast copies of weights included).

        Args:
            grid: token grid (default: the construction grid); the prefix tokens come on top.
            batch: images in the step.
            amp: autocast dtype (``torch.bfloat16``) or ``None`` for fp32.
            input_dtype: dtype of the mixer's input: ``None`` for fp32 (a ViT's stream), or ``amp`` (Swin's
                stream under autocast, where each autocast op reads the input itself instead of its own cast).
        """
        raise NotImplementedError

    def forward_with_keys(self, x: Tensor, grid: Grid,
                          key_bias: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
        """``forward`` that also returns its queries and keys and adds ``key_bias`` to every score row
        (backends declaring :attr:`exposes_attention`; token reducers call it).

        Args:
            x: ``[B, N, C]`` tokens; grid: token grid.
            key_bias: ``[B, 1, 1, N]`` added to ``QKᵀ/√d`` before the softmax (ToMe's ``log s``), or ``None``.

        Returns:
            the output ``[B, N, C]``, q and k ``[B, h, N, d]``.
        """
        raise ConfigError(f"attention={self.registry_name} does not expose its queries and keys; "
                          f"a token reducer that reads them needs attention=global")

    def before_train_step(self) -> None:
        """Per-step state, called before every training step outside ``forward`` (default: nothing)."""

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        """Values of the symbols used in :attr:`formula` (N, C, h, ... ) at ``grid``."""
        return {"N": self.seq_len(grid), "C": self.dim, "h": self.num_heads}

    def to_heads(self, t: Tensor, parts: int = 1) -> tuple[Tensor, ...]:
        """Split a (fused) projection's output into heads.

        Args:
            t: ``[B, N, parts·C]``, e.g. q (``parts=1``), k|v (2) or q|k|v (3) side by side.
            parts: how many C-wide tensors ``t`` holds.

        Returns:
            ``parts`` tensors ``[B, h, N, d]``.
        """
        B, N, _ = t.shape
        t = t.reshape(B, N, parts, self.num_heads, self.head_dim)  # [B, N, parts, h, d]
        # unbind the parts axis in place (not after moving it first): its backward then stacks the head
        # gradients straight into t's contiguous layout, one copy instead of a stack plus a permuted copy
        return tuple(p.transpose(1, 2) for p in t.unbind(2))  # parts x [B, h, N, d]

    def merge_heads(self, o: Tensor) -> Tensor:
        """``o[B, h, N, d] -> [B, N, C]`` followed by the output projection ``proj`` and ``proj_drop``.

        Args:
            o: per-head outputs; the mixer must have ``proj`` and ``proj_drop`` modules.
        """
        B, _, N, _ = o.shape
        o = o.transpose(1, 2).reshape(B, N, self.dim)  # [B, N, C]
        return self.proj_drop(self.proj(o))

    def extra_repr(self) -> str:
        return (
            f"{self.registry_name}, dim={self.dim}, heads={self.num_heads}, "
            f"grid={self.grid}, prefix={self.num_prefix}"
        )


class QKVAttention(TokenMixer):
    """Base for backends with the standard fused q/k/v projection and an output projection.

    Subclasses implement :meth:`attend` (``q, k, v[B, h, N, d] -> [B, h, N, d]``), its analytic
    cost :meth:`attend_flops` and its plain version :meth:`reference_attend`.
    """

    def __init__(self, cfg: Any, ctx: MixerContext):
        super().__init__(cfg, ctx)
        self.qkv = nn.Linear(ctx.dim, 3 * ctx.dim, bias=ctx.qkv_bias)
        self.separate_q = False  # split_heads: q and k|v from two products (see there)
        self.attn_drop = nn.Dropout(ctx.attn_drop)
        self.proj = nn.Linear(ctx.dim, ctx.dim)
        self.proj_drop = nn.Dropout(ctx.proj_drop)

    def split_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``x[B, N, C] -> q, k, v`` each ``[B, h, N, d]``: one product with the fused weight, or with
        ``separate_q`` two (q, then k|v), whose outputs are freed apart: q's as soon as nothing saves q. Both
        read one autocast copy of ``x`` (:func:`autocast_input`)."""
        if not self.separate_q:
            return self.to_heads(self.qkv(x), 3)
        x, C, bias = autocast_input(x), self.dim, self.qkv.bias
        w_q, w_kv = self.qkv.weight.split([C, 2 * C])
        b_q, b_kv = (None, None) if bias is None else bias.split([C, 2 * C])
        return (*self.to_heads(F.linear(x, w_q, b_q)), *self.to_heads(F.linear(x, w_kv, b_kv), 2))

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        q, k, v = self.split_heads(x)
        return self.merge_heads(self.attend(q, k, v, grid))

    def reference(self, x: Tensor, grid: Grid) -> Tensor:
        q, k, v = self.split_heads(x)
        return self.merge_heads(self.reference_attend(q, k, v, grid))

    def projection_flops(self, n: int) -> int:
        """q/k/v projection ``3nC²`` plus output projection ``nC²``."""
        return 3 * n * self.dim * self.dim + n * self.dim * self.dim

    def flops(self, grid: Optional[Grid] = None) -> int:
        return self.projection_flops(self.seq_len(grid)) + self.attend_flops(grid or self.grid)

    def projection_memory(self, n: int, batch: int, amp: Optional[torch.dtype],
                          input_dtype: Optional[torch.dtype] = None) -> list[Saved]:
        """What the two projections keep: the q/k/v projection's input (an autocast copy under ``amp`` of an fp32
        input, one for q and k|v with ``separate_q``; the input itself when it is in the autocast dtype), the
        output projection's and, under ``amp``, each weight's autocast copy. The q/k/v output is the attend's to
        list (it saves views of it).

        Args:
            n: tokens per image; batch: images; amp: autocast dtype or ``None``; input_dtype: the input's dtype
                (``None``: fp32).
        """
        C, size = self.dim, itemsize(amp)
        items = [Saved("qkv input", batch * n * C, size), Saved("proj input", batch * n * C, size)]
        if amp is not None:
            items += [Saved("qkv weight (autocast copy)", 3 * C * C, size),
                      Saved("proj weight (autocast copy)", C * C, size)]
        return items

    def memory(self, grid: Optional[Grid] = None, batch: int = 1, amp: Optional[torch.dtype] = None,
               input_dtype: Optional[torch.dtype] = None) -> list[Saved]:
        grid = grid or self.grid
        return (self.projection_memory(self.seq_len(grid), batch, amp, input_dtype)
                + self.attend_memory(grid, batch, amp))

    def attend_memory(self, grid: Grid, batch: int,
                      amp: Optional[torch.dtype]) -> list[Saved]:  # pragma: no cover - abstract
        """What :meth:`attend` keeps for backward (the q/k/v projection's output storage among it).

        Args:
            grid: token grid; batch: images; amp: autocast dtype or ``None``.
        """
        raise NotImplementedError

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def attend_flops(self, grid: Grid) -> int:  # pragma: no cover
        raise NotImplementedError

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:  # pragma: no cover
        raise NotImplementedError


def autocast_input(x: Tensor) -> Tensor:
    """``x`` in the autocast dtype where autocast is on for its device and would cast it (float32 or float16), else
    ``x``: the copy autocast makes for each op that reads a non-leaf ``x``, made once for several."""
    device = x.device.type
    if device == "meta" or not torch.is_autocast_enabled(device):  # autocast leaves meta tensors as they are
        return x
    dtype = torch.get_autocast_dtype(device)
    return x.to(dtype) if x.dtype in (torch.float32, torch.float16) and x.dtype != dtype else x
