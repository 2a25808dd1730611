"""Longformer attention on a 2-D token grid (``longformer``).

Papers: Beltagy et al., "Longformer: The Long-Document Transformer", arXiv 2020,
https://arxiv.org/abs/2004.05150; in 2-D: Zhang et al., "Multi-Scale Vision Longformer", ICCV 2021,
https://arxiv.org/abs/2103.15358.

Three parts, as in Longformer:

* sliding window: each grid token attends to the k×k window centred on it. Unlike ``local``, the
  window does not shift at the border: keys outside the grid are masked (Longformer pads), so
  border tokens see fewer keys while the cost (halo keys per query) does not shrink;
* dilated windows on ``attention.dilated_heads`` of the heads: k×k keys spaced δ apart, centred
  and masked the same way (δ shrinks per axis to ``side // k`` on small grids, DiNAT's rule);
* global tokens (``attention.global_tokens``): every token attends to them, their queries attend to every token.

  - ``persistent`` (the default, Vision Longformer's form): ``attention.num_global`` tokens of the sequence,
    the class token and ``num_global - 1`` learned tokens, prepended once at the model's input and carried
    through every block like any other token (each block updates them: attention, MLP, residual). The backend
    asks for them through :meth:`LongformerAttention.prefix_tokens`; the ViT sizes its prefix from it (the
    learned tokens ``global_tokens`` of the model, after the class token, with their own position-embedding
    slots). In a layer they are the P prefix tokens, P = ``num_global``; there are no per-layer tokens (g = 0).
    A host without prefix tokens (Swin: no class token, and patch merging changes the sequence between stages)
    gets the ``per_layer`` form instead, with ``num_global`` learned tokens per layer.
  - ``per_layer``: the prefix tokens (the class token) and ``num_global`` learned tokens of this layer (ETC's
    global memory). In every layer the learned tokens first read the sequence (their queries attend to every
    token) and their states ``s = t + read`` give the keys and values, so global information flows in one
    layer (see :mod:`vitzoo.attention.sparse.pattern`); they are not carried to the next layer.

Projections (the paper's Sec. 3.1, "Linear Projections for Global Attention"): two sets, Q_s, K_s, V_s
(``qkv``) and Q_g, K_g, V_g (``qkv_global``, with ``attention.global_projections: separate``, the default).
A softmax row takes its query, keys and values from one set, chosen by its query:

* global rows, Q_g, K_g, V_g: the prefix queries Q_g·x_p score K_g of every key (prefix tokens, the learned
  tokens' states, grid tokens) and average V_g; the learned tokens' read, Q_g·t over K_g, V_g of every token;
* sliding rows, Q_s, K_s, V_s: a grid query Q_s·x_i scores K_s of its window keys and of the global keys
  (prefix tokens and states) and averages their V_s.

So the scores of "every token attends to the global tokens" use the sliding projections, as in the authors'
released code and its port to ``transformers`` (``query_global``/``key_global``/``value_global`` are applied
only to the global tokens' rows; the other rows score the global keys with ``key``). Changing the global
weights changes the prefix outputs and the learned states, and reaches a grid query only through the
states' keys and values.

The global projection is initialised independently (as every linear layer when the model is built), not
copied from ``qkv``: the paper copies Q_s, K_s, V_s into Q_g, K_g, V_g because it starts from a pretrained
RoBERTa (from timm weights, ``model.pretrained``, vitzoo reports ``qkv_global`` as new and keeps that
initialisation). ``attention.global_projections: shared`` uses ``qkv`` for every row (no ``qkv_global``). A state
dict without ``qkv_global`` (written with ``shared``) does not load into ``separate``: a strict load names the
missing ``qkv_global`` tensors.

Costs: :attr:`LongformerAttention.formula` (``separate``) and ``shared_formula`` cover both forms: g is the number of
per-layer learned tokens, 0 in the ``persistent`` form, where the formula is ``6NC² + 2(K_l + P)L_lC_l +
2(K_δ + P)L_δC_δ + 2PNC`` with P = ``num_global``.

Where it departs from the paper: one attention layer per block at one grid (Vision Longformer is multi-scale, with
patch merging between stages and a relative position bias); windows masked at the border rather than
shifted; dilated heads (from Longformer, not in Vision Longformer).

Windows run as blocked (halo) attention per head group (:mod:`vitzoo.attention.sparse.halo`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, autocast_input, check, check_non_negative, check_positive
from vitzoo.attention.sparse import flex
from vitzoo.attention.sparse.geometry import Neighbourhood, check_num_global, check_odd_kernel
from vitzoo.attention.sparse.neighbourhood import (
    GlobalNeighbourhoodAttention,
    NeighbourhoodAttention,
    check_num_global_option,
)
from vitzoo.costs import Saved, itemsize

GLOBAL_PROJECTIONS = ("separate", "shared")  # values of attention.global_projections
GLOBAL_TOKENS = ("persistent", "per_layer")  # values of attention.global_tokens


@dataclass
class LongformerConfig:
    kernel_size: int = 3  # sliding-window side k (odd, <= the grid's shorter side)
    dilation: int = 2  # key stride δ of the dilated heads; shrinks per axis to side // k on small grids
    dilated_heads: int = 1  # heads (the last ones) using dilated windows, 0..num_heads
    num_global: int = 1  # persistent: global tokens, the class token among them; per_layer: learned tokens per layer
    global_tokens: str = "persistent"  # persistent: sequence tokens carried through every block; per_layer: per layer
    impl: str = "auto"  # auto (flex on CUDA, blocked elsewhere), blocked (halo/gathered) or flex (FlexAttention)
    global_projections: str = "separate"  # separate: global rows use their own Q/K/V (the paper); shared: qkv

    def __post_init__(self):
        check_odd_kernel(self)
        flex.check_impl(self)
        check_positive(self, "dilation")
        check_non_negative(self, "dilated_heads")
        check_num_global_option(self)
        check(self.global_projections in GLOBAL_PROJECTIONS,
              f"attention.global_projections must be one of {', '.join(GLOBAL_PROJECTIONS)} "
              f"(got {self.global_projections!r})")
        check(self.global_tokens in GLOBAL_TOKENS,
              f"attention.global_tokens must be one of {', '.join(GLOBAL_TOKENS)} (got {self.global_tokens!r})")
        check(self.global_tokens == "per_layer" or self.num_global >= 1,
              f"attention.num_global={self.num_global} with attention.global_tokens=persistent: the class token is "
              f"one of the global tokens, so num_global >= 1")


@register_attention("longformer", LongformerConfig)
class LongformerAttention(GlobalNeighbourhoodAttention):
    """Sliding windows (masked at the border), dilated windows on some heads, global tokens.

    Its cost is :attr:`formula` (P prefix tokens; g learned tokens per layer, 0 in the ``persistent`` form, whose
    global tokens are the P prefix tokens; L_l/L_δ query slots of the blocked grid and K_l/K_δ halo keys per
    block of the sliding/dilated heads, C_l/C_δ their channels); the instance's follows
    ``attention.global_projections``. With ``separate``: ``6NC²`` for the projections (queries: Q_s of the grid
    tokens, Q_g of the prefix tokens; K_s, V_s and K_g, V_g of every token; the output projection), ``3gC²`` for
    the learned tokens' queries (Q_g) and their states' K_s, V_s, ``2min(P, 1)gC²`` for the states' K_g, V_g
    that the prefix rows score (none without a prefix token).

    Args:
        cfg: :class:`LongformerConfig`.
        ctx: the host's context.
    """

    formula = ("6NC² + 3gC² + 2min(P, 1)gC² + 2gNC + 2(K_l + P + g)L_lC_l + 2(K_δ + P + g)L_δC_δ"
               " + 2P(N + g)C")  # separate; the instance's formula follows global_projections
    shared_formula = "4NC² + 3gC² + 2gNC + 2(K_l + P + g)L_lC_l + 2(K_δ + P + g)L_δC_δ + 2P(N + g)C"

    @classmethod
    def prefix_tokens(cls, cfg: LongformerConfig) -> int:
        """``persistent``: the host carries ``num_global`` prefix tokens (the class token among them); else 0."""
        return cfg.num_global if cfg.global_tokens == "persistent" else 0

    def __init__(self, cfg: LongformerConfig, ctx: MixerContext):
        check(cfg.dilated_heads <= ctx.num_heads,
              f"attention.dilated_heads={cfg.dilated_heads} exceeds the layer's {ctx.num_heads} heads "
              f"(model.num_heads); pick 0..{ctx.num_heads}")
        persistent = cfg.global_tokens == "persistent" and ctx.num_prefix > 0  # a host without prefix: per_layer
        check(not persistent or ctx.num_prefix >= cfg.num_global,
              f"attention.num_global={cfg.num_global} persistent global tokens, but the host carries "
              f"{ctx.num_prefix} prefix token(s): build the model with vitzoo.create_model (it prepends them) or set "
              f"attention.global_tokens=per_layer")
        check(cfg.num_global > 0 or ctx.num_prefix > 0,
              "attention=longformer needs a global token: attention.num_global=0 on a model without a class token "
              "(Swin) leaves only sliding windows; set attention.num_global >= 1 or use attention=local")
        learned = 0 if persistent else cfg.num_global  # per-layer learned tokens g
        check_num_global(learned, ctx.grid)
        NeighbourhoodAttention.__init__(self, cfg, ctx, num_learned=learned)  # g from the form, not cfg.num_global
        self.global_form = "persistent" if persistent else "per_layer"
        self.setup()
        if cfg.global_projections == "separate":  # Q_g, K_g, V_g of the global rows (module docstring)
            self.qkv_global = nn.Linear(ctx.dim, 3 * ctx.dim, bias=ctx.qkv_bias).to(self.qkv.weight.device)
        else:
            self.formula = self.shared_formula

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        """``x[B, P + H·W, C] -> [B, P + H·W, C]``: each row with its own projections (module docstring).

        Args:
            x: every token (prefix first).
            grid: (H, W).
        """
        if self.qkv_global is None:
            return super().forward(x, grid)
        q, k, v, kv_glob = self.split_rows(x)
        return self.merge_heads(self.attend(q, k, v, grid, kv_glob))

    def split_rows(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor]]:
        """``x[B, N, C]`` -> ``q, k, v`` and ``kv_glob`` (each ``[B, h, N, d]``) for ``attend`` with ``qkv_global``.

        Args:
            x: every token (prefix first).

        Returns:
            ``q``: each row's own queries, Q_g·x for the prefix rows and Q_s·x for the grid rows; ``k, v``: K_s·x,
            V_s·x of every token (``qkv``); ``kv_glob``: K_g·x, V_g·x of every token (``qkv_global``).
        """
        P, C = self.num_prefix, self.dim
        (w, bias), (wg, bias_g) = ((m.weight, m.bias) for m in (self.qkv, self.qkv_global))
        x = autocast_input(x)  # one copy that every product reads (each would cast x apart)
        q = F.linear(x[:, P:], w[:C], None if bias is None else bias[:C])  # grid queries: [B, L, C]
        if P:
            q_pre = F.linear(x[:, :P], wg[:C], None if bias_g is None else bias_g[:C])  # prefix queries: [B, P, C]
            q = torch.cat([q_pre, q], dim=1)
        kv = F.linear(x, w[C:], None if bias is None else bias[C:])  # [B, N, 2C]
        kv_glob = F.linear(x, wg[C:], None if bias_g is None else bias_g[C:])  # [B, N, 2C]
        return (*self.to_heads(q), *self.to_heads(kv, 2), self.to_heads(kv_glob, 2))

    def projection_flops(self, n: int) -> int:
        """q/k/v and output projections ``4nC²``; with ``qkv_global`` also K_g, V_g of every token, ``2nC²``
        (each row's queries come from one of the two projections: ``nC²`` in all).

        Args:
            n: tokens N = P + H·W.
        """
        extra = 0 if self.qkv_global is None else 2 * n * self.dim * self.dim
        return super().projection_flops(n) + extra

    def projection_memory(self, n: int, batch: int, amp: Optional[torch.dtype],
                          input_dtype: Optional[torch.dtype] = None) -> list[Saved]:
        """With ``qkv_global``, what :meth:`split_rows` keeps: the input ``x`` (of K_s, V_s and K_g, V_g; under
        autocast with an fp32 input its one autocast copy, which every product reads), the grid rows' and the
        prefix rows' inputs where they are copies (a slice across images: ``B > 1``) and, under autocast, each
        weight slice's copy.

        Args:
            n: tokens N = P + H·W; batch: images; amp: autocast dtype or None; input_dtype: the input's dtype
                (``None``: fp32).
        """
        if self.qkv_global is None:
            return super().projection_memory(n, batch, amp, input_dtype)
        B, C, P, size = batch, self.dim, self.num_prefix, itemsize(amp)
        items = [Saved("qkv input", B * n * C, size), Saved("proj input", B * n * C, size)]  # [B, N, C] each
        # every product reads x (or its one autocast copy) or a slice of it
        if P and B > 1:  # x[:, P:] flattened for the grid queries: [B·L, C]
            items.append(Saved("grid queries' input (copy)", B * (n - P) * C, size))
        if P > 1 and B > 1:  # x[:, :P] flattened for the prefix queries: [B·P, C]
            items.append(Saved("prefix queries' input (copy)", B * P * C, size))
        if amp is not None:
            items += [Saved("q weight rows (autocast copy)", C * C, size),  # [C, C]
                      Saved("k|v weight rows (autocast copy)", 2 * C * C, size),  # [2C, C]
                      Saved("global k|v weight rows (autocast copy)", 2 * C * C, size),  # [2C, C]
                      Saved("proj weight (autocast copy)", C * C, size)]  # [C, C]
            if P:
                items.append(Saved("global q weight rows (autocast copy)", C * C, size))  # [C, C]
        return items

    def attend_flops(self, grid: Grid) -> int:
        """The pattern's MACs (:class:`~vitzoo.attention.sparse.pattern.SparsePatternAttention`); with
        ``qkv_global`` and prefix tokens also K_g, V_g of the g learned tokens' states, which the prefix rows
        score: ``2gC²``.

        Args:
            grid: (H, W).
        """
        C = self.dim
        extra = 2 * self.num_learned * C * C if self.qkv_global is not None and self.num_prefix else 0
        return super().attend_flops(grid) + extra

    def head_patterns(self, grid: Grid) -> list[tuple[int, Optional[Neighbourhood]]]:
        k, dilated = self.cfg.kernel_size, self.cfg.dilated_heads
        return [(self.num_heads - dilated, Neighbourhood(k, 1, "mask")),
                (dilated, Neighbourhood(k, self.cfg.dilation, "mask"))]

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        (n_l, local), (n_d, dilated) = self.head_patterns(grid or self.grid)
        return {**super().symbols(grid), **self.halo_symbols(grid, local, "l"), **self.halo_symbols(grid, dilated, "δ"),
                "C_l": n_l * self.head_dim, "C_δ": n_d * self.head_dim}

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, dilation={self.dilation_at()} on {self.cfg.dilated_heads} heads, "
                f"global_tokens={self.global_form}, global_projections={self.cfg.global_projections}")
