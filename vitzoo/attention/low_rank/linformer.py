"""Linformer: keys and values projected along the sequence from N to k.

Paper: Wang et al., "Linformer: Self-Attention with Linear Complexity", 2020,
https://arxiv.org/abs/2006.04768.

``head_i = softmax(Q_i (E_i K_i)ᵀ/√d) (F_i V_i)`` with learned ``E_i, F_i ∈ R^{k×N}``. Sharing
(``sharing``, the paper's §4 options): ``none`` (an E and an F per head), ``headwise`` (one E and
one F for all heads of the layer), ``kv`` (one matrix for keys, values and all heads). The paper's
layerwise sharing (one matrix for the whole network) is not offered: each block owns its mixer.

Prefix tokens (the class token) are projected along with the grid tokens: E and F have
``P + H·W`` columns, and every token, class token included, queries the k projected tokens.
``k`` larger than N is clamped to N (no compression to gain).

The projections depend on N, so the mixer is fixed-length (``fixed_length = True``): another grid
is an error unless ``interpolate: true``, which resamples the grid columns of E/F bilinearly as an
image (:func:`vitzoo.attention.functional.resample_tokens`, prefix columns kept) and multiplies them by
``H·W / H'·W'`` so a projected token keeps its magnitude when the grid grows or shrinks.

The fast path (:class:`LinformerCore`) goes from the fused projection ``qkv[B, N, 3C]`` to merged
heads in one autograd node that saves only ``qkv`` and ``E``, ``F``: the projected keys and values
and the ``[N, k]`` probabilities are recomputed in backward chunk by chunk, and the gradients of q, k
and v are written straight into one ``[B, N, 3C]`` buffer (no copies of q, k, v, no stacked
gradients). With attention dropout in training the per-head form (:meth:`attend`, SDPA) is used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, QKVAttention, check, check_positive
from vitzoo.attention.functional import dense_attention, head_chunks, resample_tokens, sdpa, sdpa_flops

SHARING = ("none", "headwise", "kv")


@dataclass
class LinformerConfig:
    k: int = 32  # projected sequence length (clamped to N)
    sharing: str = "none"  # none: E, F per head; headwise: one E, one F per layer; kv: one matrix per layer
    interpolate: bool = False  # at another grid resample E/F (true) or raise a ConfigError (false)

    def __post_init__(self):
        check_positive(self, "k")
        check(self.sharing in SHARING, f"attention.sharing must be one of {', '.join(SHARING)} (got {self.sharing!r})")


@register_attention("linformer", LinformerConfig)
class LinformerAttention(QKVAttention):
    """Attention over k sequence-projected keys/values; its cost is :attr:`formula`.

    Args:
        cfg: LinformerConfig (validated options, see ``vitzoo/conf/attention/linformer.yaml``).
        ctx: dims, heads, grid, prefix tokens and layer index from the host block.
    """

    formula = "4NC² + 4NkC"  # plus 4·(E/F entries) for resampling when run at another grid
    linear_cost = True
    fixed_length = True

    def __init__(self, cfg: LinformerConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        n = self.seq_len()
        self.k = min(cfg.k, n)
        mats = 1 if cfg.sharing == "kv" else 2
        heads = self.num_heads if cfg.sharing == "none" else 1
        # [E/F, heads, N, k]: E_i (k×N in the paper) is seq_proj[0, i].T
        self.seq_proj = nn.Parameter(torch.empty(mats, heads, n, self.k))
        self.init_weights()

    def init_weights(self) -> None:
        """Normal with std 1/√N: a projected token has the magnitude of one input token."""
        nn.init.normal_(self.seq_proj, std=self.seq_len() ** -0.5)

    def projections(self, grid: Grid) -> tuple[Tensor, Tensor]:
        """``(E, F)`` for ``grid``, each ``[heads, N, k]`` (heads = h or 1), resampled if needed."""
        proj = self.projection_weights(grid)
        return proj[0], proj[-1]

    def projection_weights(self, grid: Grid) -> Tensor:
        """E and F for ``grid`` stacked ``[mats, heads, N, k]`` (``seq_proj`` itself at the build grid)."""
        self.check_grid(grid)
        proj = self.seq_proj
        if tuple(grid) != self.grid:
            P = self.num_prefix
            proj = resample_tokens(proj, self.grid, grid, P, dim=-2)  # [mats, heads, N', k]
            area = (self.grid[0] * self.grid[1]) / (grid[0] * grid[1])
            proj = torch.cat([proj[..., :P, :], proj[..., P:, :] * area], dim=-2)
        return proj

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        if self.training and self.attn_drop.p > 0:
            return super().forward(x, grid)  # dropout on the probabilities: the per-head form
        proj = self.projection_weights(grid)
        return self.proj_drop(self.proj(linformer_attention_qkv(self.qkv(x), proj, self.num_heads, self.scale)))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        e, f = self.projections(grid)
        k = (k.transpose(-2, -1) @ e).transpose(-2, -1)  # Kᵀ E -> [B, h, k, d]: N·d·k per head
        v = (v.transpose(-2, -1) @ f).transpose(-2, -1)  # Vᵀ F -> [B, h, k, d]: N·d·k per head
        return sdpa(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)

    def attend_flops(self, grid: Grid) -> int:
        n, d = self.seq_len(grid), self.head_dim
        # E·K and F·V: N·k·d each per head
        project = 2 * self.num_heads * n * self.k * d
        # Q(EK)ᵀ: N·k·d, softmax·(FV): N·k·d, per head
        attend = sdpa_flops(1, self.num_heads, n, self.k, d)
        # interpolate at another grid: bilinear resampling of E/F, 4 per output entry (fvcore's rule)
        mats, heads = self.seq_proj.shape[:2]
        resample = 0 if tuple(grid) == self.grid else 4 * mats * heads * self.k * grid[0] * grid[1]
        return project + attend + resample

    def reference_attend(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        e, f = self.projections(grid)
        e, f = e.expand(self.num_heads, -1, -1), f.expand(self.num_heads, -1, -1)  # [h, N, k]
        k = torch.einsum("hnj,bhnd->bhjd", e, k)  # k_j = Σ_n E_jn k_n  [B, h, k, d]
        v = torch.einsum("hnj,bhnd->bhjd", f, v)  # v_j = Σ_n F_jn v_n  [B, h, k, d]
        return dense_attention(q, k, v)

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        return {**super().symbols(grid), "k": self.k}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, k={self.k}, sharing={self.cfg.sharing}"


def _projection_slice(p: Tensor, heads: slice) -> Tensor:
    """A chunk's E or F: ``[1, N, k]`` shared by the heads, or ``[h, N, k]`` cut to the chunk's heads."""
    return p if p.shape[0] == 1 else p[heads]


def _chunk_probabilities(q: Tensor, k: Tensor, v: Tensor, e: Tensor, f: Tensor,
                         scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """Projected keys and values ``Eᵀ K``, ``Fᵀ V`` ``[b, h, k, d]`` of a chunk and its probabilities
    ``softmax(Q (Eᵀ K)ᵀ · scale)`` ``[b, h, N, k]``."""
    k_p = e.transpose(-2, -1) @ k  # Eᵀ K [b, h, k, d]: N·k·d per head
    v_p = f.transpose(-2, -1) @ v  # Fᵀ V [b, h, k, d]: N·k·d per head
    p = (q @ k_p.transpose(-2, -1)).mul_(scale).softmax(dim=-1)  # [b, h, N, k]: N·k·d per head
    return k_p, v_p, p


class LinformerCore(torch.autograd.Function):
    """``softmax(Q (Eᵀ K)ᵀ · scale) (Fᵀ V)`` from ``qkv[B, N, 3C]`` to ``out[B, N, C]``, saving ``qkv``
    and the projections only (module docstring). Arguments as :func:`linformer_attention_qkv`.
    """

    @staticmethod
    def forward(ctx, qkv: Tensor, proj: Tensor, heads: int, scale: float) -> Tensor:
        with torch.autocast(qkv.device.type, enabled=False):
            out = linformer_forward(qkv, proj, heads, scale)
        ctx.heads, ctx.scale = heads, scale
        ctx.save_for_backward(qkv, proj)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        qkv, proj = ctx.saved_tensors
        heads, scale = ctx.heads, ctx.scale
        B, N, C3 = qkv.shape
        d = C3 // 3 // heads
        grad_qkv = torch.empty_like(qkv, memory_format=torch.contiguous_format)
        grad_proj = torch.zeros_like(proj)
        grad_e, grad_f = grad_proj[0], grad_proj[-1]  # the same matrix when keys and values share it
        g5, q5, o5 = grad_qkv.view(B, N, 3, heads, d), qkv.reshape(B, N, 3, heads, d), grad.reshape(B, N, heads, d)
        ec, fc = proj[0].to(qkv.dtype), proj[-1].to(qkv.dtype)
        with torch.autocast(qkv.device.type, enabled=False):
            # three [N, k] blocks per (image, head) at once: the probabilities, their gradient and the scores' gradient
            for b, j in head_chunks(B, heads, 3 * N * proj.shape[-1], qkv.device):
                q, k, v = (q5[b, :, i, j].transpose(1, 2) for i in range(3))  # [b, h, N, d] views
                e_c, f_c = _projection_slice(ec, j), _projection_slice(fc, j)
                k_p, v_p, p = _chunk_probabilities(q, k, v, e_c, f_c, scale)
                g = o5[b, :, j].transpose(1, 2)  # ∂L/∂out [b, h, N, d]
                grad_vp = p.transpose(-2, -1) @ g  # [b, h, k, d]
                grad_s = torch._softmax_backward_data(g @ v_p.transpose(-2, -1), p, -1, p.dtype).mul_(scale)
                del p
                g5[b, :, 0, j] = (grad_s @ k_p).transpose(1, 2)  # ∂L/∂Q
                grad_kp = grad_s.transpose(-2, -1) @ q  # [b, h, k, d]
                del grad_s
                g5[b, :, 1, j] = (e_c @ grad_kp).transpose(1, 2)  # ∂L/∂K = E ∂L/∂(EᵀK)
                g5[b, :, 2, j] = (f_c @ grad_vp).transpose(1, 2)  # ∂L/∂V
                _accumulate(grad_e, k @ grad_kp.transpose(-2, -1), j)  # ∂L/∂E = K ∂L/∂(EᵀK)ᵀ [b, h, N, k]
                _accumulate(grad_f, v @ grad_vp.transpose(-2, -1), j)
        return grad_qkv, grad_proj, None, None


def _accumulate(grad: Tensor, part: Tensor, heads: slice) -> None:
    """Add a chunk's ``[b, h, N, k]`` gradient of E or F to ``grad`` ``[h or 1, N, k]`` (summed over images,
    and over heads when they share the matrix)."""
    if grad.shape[0] == 1:
        grad += part.sum(dim=(0, 1)).to(grad.dtype)
    else:
        grad[heads] += part.sum(dim=0).to(grad.dtype)


def linformer_forward(qkv: Tensor, proj: Tensor, heads: int, scale: float) -> Tensor:
    """Forward of :class:`LinformerCore` without autograd, chunk by chunk. Arguments as
    :func:`linformer_attention_qkv`."""
    B, N, C3 = qkv.shape
    d = C3 // 3 // heads
    out = qkv.new_empty(B, N, heads * d)
    q5, o5 = qkv.reshape(B, N, 3, heads, d), out.view(B, N, heads, d)
    e, f = proj[0].to(qkv.dtype), proj[-1].to(qkv.dtype)
    for b, j in head_chunks(B, heads, N * proj.shape[-1], qkv.device):
        q, k, v = (q5[b, :, i, j].transpose(1, 2) for i in range(3))  # [b, h, N, d] views
        _, v_p, p = _chunk_probabilities(q, k, v, _projection_slice(e, j), _projection_slice(f, j), scale)
        o5[b, :, j] = (p @ v_p).transpose(1, 2)  # [b, N, h, d]: N·k·d per head
    return out


def linformer_attention_qkv(qkv: Tensor, proj: Tensor, heads: int, scale: float) -> Tensor:
    """Linformer attention per head from the fused projection to the merged heads
    (:class:`LinformerCore`; a plain forward when tracing with ``torch.jit.trace``).

    Args:
        qkv: ``[B, N, 3C]``, q, k and v side by side, heads ``[h, d]`` within each.
        proj: ``[E, F]`` ``[2, h, N, k]``: key and value projections, ``[2, 1, N, k]`` shared by the heads
            or ``[1, 1, N, k]`` (one matrix for keys, values and heads).
        heads: h.
        scale: factor of the scores (``1/√d``).

    Returns:
        ``out`` ``[B, N, C]`` (heads merged) in ``qkv``'s dtype.
    """
    if torch.jit.is_tracing():
        return linformer_forward(qkv, proj, heads, scale)
    return LinformerCore.apply(qkv, proj, heads, scale)
