"""Mimetic initialisation of self-attention weights.

Paper: Trockman & Kolter, "Mimetic Initialization of Self-Attention Layers", ICML 2023,
https://arxiv.org/abs/2305.09828. Trained attention layers have ``W_q W_kᵀ`` close to a positive multiple of the
identity plus noise (tokens attend to similar tokens, themselves included) and ``W_v W_o`` close to a negative
multiple of it; initialising them that way lets a ViT learn faster on small data sets.

In the row-vector convention of ``nn.Linear`` (``q = x W_qᵀ``), head ``h``'s score matrix is
``x W_{q,h}ᵀ W_{k,h} xᵀ``: :func:`mimetic_init_` sets ``W_{q,h}ᵀ W_{k,h}`` to the best rank-``d`` approximation of
``α₁ Z + β₁ I`` (a fresh ``Z`` per head) and ``W_vᵀ W_oᵀ`` to ``α₂ Z − β₂ I`` exactly, ``Z ~ N(0, 1/C)``. It applies
to every backend built on the fused q/k/v projection (:class:`~vitzoo.attention.base.QKVAttention`; Reformer, whose
queries are its keys, excepted); mixers without queries and keys (FNet, GFNet, AFNO, MLP-Mixer, gMLP,
Synthesizer, ...) keep their own initialisation.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from vitzoo.attention.base import QKVAttention

QK = (0.7, 0.7)  # (α₁, β₁): the paper's values for W_q W_kᵀ
VO = (0.4, 0.4)  # (α₂, β₂): the paper's values for W_v W_o


def _factor(m: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """``A, B`` of shape ``[rank, C]`` with ``Aᵀ B`` the best rank-``rank`` approximation of ``m[C, C]``."""
    u, s, vh = torch.linalg.svd(m)  # m = u diag(s) vh
    root = s[:rank].sqrt()
    return (u[:, :rank] * root).T, root[:, None] * vh[:rank]  # [rank, C] each


@torch.no_grad()
def mimetic_init_(attn: QKVAttention, generator: torch.Generator | None = None, qk: tuple = QK,
                  vo: tuple = VO) -> None:
    """Set ``attn``'s q/k/v and output projection weights in place (biases zeroed).

    Args:
        attn: a backend with the fused ``qkv`` [3C, C] and ``proj`` [C, C] linears and ``num_heads`` heads.
        generator: random source for ``Z`` (None: torch's global one).
        qk: ``(α₁, β₁)`` of ``W_q W_kᵀ``.
        vo: ``(α₂, β₂)`` of ``W_v W_o``.
    """
    C, h = attn.dim, attn.num_heads
    d = C // h
    eye = torch.eye(C, dtype=torch.float64)

    def noise() -> Tensor:
        return torch.randn(C, C, generator=generator, dtype=torch.float64) / C**0.5

    w_q, w_k = [], []
    for _ in range(h):
        a, b = _factor(qk[0] * noise() + qk[1] * eye, d)  # a, b: [d, C]
        w_q.append(a)
        w_k.append(b)
    v_t, o_t = _factor(vo[0] * noise() - vo[1] * eye, C)  # W_vᵀ W_oᵀ = v_tᵀ o_t
    weight = attn.qkv.weight  # [3C, C]: rows q (head by head), then k, then v
    weight.copy_(torch.cat([*w_q, *w_k, v_t]).to(weight))
    attn.proj.weight.copy_(o_t.T.to(attn.proj.weight))  # W_o = o_tᵀ, so W_vᵀ W_oᵀ = v_tᵀ o_t
    for lin in (attn.qkv, attn.proj):
        if lin.bias is not None:
            lin.bias.zero_()


def applies(attn: QKVAttention) -> bool:
    """True where the layer has the fused ``qkv`` [3C, C]: Reformer shares queries and keys (its ``W_q W_kᵀ`` is
    ``W_q W_qᵀ``, positive semi-definite by construction) and keeps its own initialisation."""
    qkv = getattr(attn, "qkv", None)
    return isinstance(qkv, nn.Linear) and tuple(qkv.weight.shape) == (3 * attn.dim, attn.dim)


def apply_mimetic_init(model: nn.Module) -> int:
    """:func:`mimetic_init_` on every :class:`~vitzoo.attention.base.QKVAttention` in ``model``; returns how many.

    Args:
        model: a backbone (its other weights are left as they are).
    """
    layers = [m for m in model.modules() if isinstance(m, QKVAttention) and applies(m)]
    for m in layers:
        mimetic_init_(m)
    return len(layers)
