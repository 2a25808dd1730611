"""AFNO: the adaptive Fourier neural operator (``afno``).

Paper: Guibas et al., "Adaptive Fourier Neural Operators: Efficient Token Mixers for Transformers",
ICLR 2022, https://arxiv.org/abs/2111.13587. A real 2-D FFT of the H×W token grid; at every frequency a
block-diagonal complex MLP (k blocks of b = C/k channels, hidden width b·f, ReLU), shared by all
frequencies; soft-shrinkage ``S_λ`` of the result (sparsity); the inverse FFT; plus the layer's input (the
paper's code adds it back inside the mixer). Cost N log N; the weights do not depend on the grid.

A complex product ``(a + ib)(W_r + iW_i)`` is four real products (the paper's code), computed as one real
matrix product over interleaved (real, imaginary) channels. Prefix tokens (ViT's
class token) are not grid positions: each one's output is the mean of the grid outputs.

FLOPs: FFTs as in :mod:`vitzoo.attention.token_mixing.gfnet` (FNet's convention); the block MLP at the
F = H·(⌊W/2⌋+1) frequencies: 4 real products of F·k·b·bf per layer, two layers: ``8FCbf``; biases,
ReLU and shrinkage 0.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, TokenMixer, check, check_positive, check_positive_number
from vitzoo.attention.token_mixing.fnet import fft_macs
from vitzoo.attention.token_mixing.gfnet import (
    REAL_FFT_HANDLES,
    fft_dtype,
    grid_and_prefix,
    with_prefix,
)


@dataclass
class AFNOConfig:
    num_blocks: Optional[int] = None  # k diagonal blocks of the MLP (AFNO uses 8); null = one per attention head
    hidden_factor: int = 1  # f: hidden width of each block's MLP is f·C/k (the paper's default 1)
    sparsity: float = 0.01  # λ of the soft-shrinkage (the paper's default)

    def __post_init__(self):
        check_positive(self, "hidden_factor")
        check_positive_number(self, "sparsity")
        if self.num_blocks is not None:
            check_positive(self, "num_blocks")


@register_attention("afno", AFNOConfig)
class AdaptiveFourierMixer(TokenMixer):
    """FFT → block-diagonal complex MLP → soft-shrink → inverse FFT, plus the input; cost :attr:`formula`.

    Args:
        cfg: AFNOConfig.
        ctx: dims, heads (the default block count) and prefix tokens.
    """

    formula = "2C·⌊5/2·M·log₂(M) + 1/2⌋ + 8FCbf"
    flop_handles = REAL_FFT_HANDLES

    def __init__(self, cfg: AFNOConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        k = cfg.num_blocks or ctx.num_heads
        check(ctx.dim % k == 0, f"attention.num_blocks ({k}) must divide model.embed_dim ({ctx.dim})")
        self.blocks, self.block = k, ctx.dim // k
        hid = self.block * cfg.hidden_factor
        scale = 0.02  # the paper's init
        self.w1 = nn.Parameter(scale * torch.randn(2, k, self.block, hid))  # (real, imag) [2, k, b, bf]
        self.b1 = nn.Parameter(scale * torch.randn(2, k, hid))
        self.w2 = nn.Parameter(scale * torch.randn(2, k, hid, self.block))  # [2, k, bf, b]
        self.b2 = nn.Parameter(scale * torch.randn(2, k, self.block))

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        g, _ = grid_and_prefix(x, self.num_prefix, grid)
        B, H, W, C = g.shape
        k, b = self.blocks, self.block
        # FFT over contiguous rows (channel-first), then the blocks as the batch of two matrix products
        spec = torch.fft.rfft2(g.to(fft_dtype(x)).permute(0, 3, 1, 2).contiguous(), norm="ortho")  # [B, C, H, W/2+1]
        f = H * spec.shape[-1]  # kept frequencies
        z = torch.view_as_real(spec).reshape(B, k, b, f, 2)  # [B, k, b, F, re/im]
        z = z.permute(1, 0, 3, 2, 4).reshape(k, B * f, 2 * b)  # [k, B·F, (b, re/im)]
        z = self._layer(z, self.w1, self.b1).relu()  # [k, B·F, (bf, re/im)]
        z = _shrink(self._layer(z, self.w2, self.b2), self.cfg.sparsity)  # [k, B·F, (b, re/im)]
        z = z.view(k, B, f, b, 2).permute(1, 0, 3, 2, 4).reshape(B, C, H, f // H, 2)  # [B, C, H, W/2+1, re/im]
        y = torch.fft.irfft2(torch.view_as_complex(z), s=(H, W), norm="ortho")  # [B, C, H, W]
        return with_prefix((y.permute(0, 2, 3, 1) + g).to(x.dtype), self.num_prefix)  # [B, N, C]

    @staticmethod
    def _layer(z: Tensor, w: Tensor, b: Tensor) -> Tensor:
        """One complex block-diagonal linear layer ``(re + i·im)(w_r + i·w_i) + b`` as one real batched matrix
        product over interleaved (re, im) channels: the weight ``[[w_r, w_i], [−w_i, w_r]]`` per channel pair
        holds the four real products of the paper's code (the same multiply-adds).

        Args:
            z: interleaved input ``[k, rows, (i, re/im)]``.
            w: weights ``[2, k, i, o]`` (real, imaginary); b: biases ``[2, k, o]``.
        """
        w, b = w.to(z.dtype), b.to(z.dtype)
        k, i, o = w.shape[1:]
        rows = torch.stack([torch.stack([w[0], w[1]], -1), torch.stack([-w[1], w[0]], -1)], 2)  # [k, i, 2, o, 2]
        out = torch.bmm(z, rows.reshape(k, 2 * i, 2 * o))  # [k, rows, (o, re/im)]
        return out + torch.stack([b[0], b[1]], -1).reshape(k, 1, 2 * o)

    def reference(self, x: Tensor, grid: Grid) -> Tensor:
        """Full complex DFT (explicit DFT matrices), the per-block MLP in complex arithmetic on the
        kept frequencies, the Hermitian spectrum rebuilt and inverted with DFT matrices."""
        H, W = grid
        g = x[:, self.num_prefix:].to(torch.float64).reshape(x.shape[0], H, W, self.dim)
        fh, fw = _dft(H, -1), _dft(W, -1)
        spec = torch.einsum("ah,bw,nhwc->nabc", fh, fw, g.to(torch.complex128)) / (H * W) ** 0.5
        wf = W // 2 + 1
        z = spec[:, :, :wf].reshape(*spec.shape[:2], wf, self.blocks, self.block)
        w1 = torch.complex(self.w1[0], self.w1[1]).to(torch.complex128)
        w2 = torch.complex(self.w2[0], self.w2[1]).to(torch.complex128)
        b1 = torch.complex(self.b1[0], self.b1[1]).to(torch.complex128)
        b2 = torch.complex(self.b2[0], self.b2[1]).to(torch.complex128)
        h1 = torch.einsum("nhwki,kio->nhwko", z, w1) + b1
        h1 = torch.complex(h1.real.clamp(min=0), h1.imag.clamp(min=0))
        h2 = torch.einsum("nhwki,kio->nhwko", h1, w2) + b2
        lam = self.cfg.sparsity
        h2 = torch.complex(torch.sign(h2.real) * (h2.real.abs() - lam).clamp(min=0),
                           torch.sign(h2.imag) * (h2.imag.abs() - lam).clamp(min=0)).flatten(-2)
        full = torch.zeros(x.shape[0], H, W, self.dim, dtype=torch.complex128, device=x.device)
        full[:, :, :wf] = h2
        neg = (-torch.arange(H)) % H
        for c in range(wf, W):  # a real signal's spectrum: Z[h, c] = conj(Z[-h, W - c])
            full[:, :, c] = h2[:, neg, W - c].conj()
        for c in {0, W // 2} if W % 2 == 0 else {0}:  # columns a real inverse reads as Hermitian in h
            full[:, :, c] = (h2[:, :, c] + h2[:, neg, c].conj()) / 2
        y = torch.einsum("ah,bw,nhwc->nabc", _dft(H, 1), _dft(W, 1), full).real / (H * W) ** 0.5
        return with_prefix(y + g, self.num_prefix).to(x.dtype)

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        h, w = grid or self.grid
        return {"C": self.dim, "M": h * w, "F": h * (w // 2 + 1), "b": self.block, "f": self.cfg.hidden_factor}

    def flops(self, grid: Optional[Grid] = None) -> int:
        h, w = grid or self.grid
        freqs, hid = h * (w // 2 + 1), self.block * self.cfg.hidden_factor
        # rfft2 + irfft2 per channel; two layers of 4 real products F·k·b·bf each
        return 2 * self.dim * fft_macs(h * w) + 8 * freqs * self.blocks * self.block * hid


def _shrink(t: Tensor, lam: float) -> Tensor:
    """Soft-shrinkage ``S_λ(t) = t − clamp(t, −λ, λ)`` (a NaN stays NaN, unlike ``F.softshrink``)."""
    return t - t.clamp(-lam, lam)


def _dft(n: int, sign: int) -> Tensor:
    """``exp(sign·2πi·jk/n)`` as a complex128 matrix ``[n, n]``."""
    idx = torch.arange(n)
    return torch.exp(sign * 2j * torch.pi * (torch.outer(idx, idx) % n).double() / n)
