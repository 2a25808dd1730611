"""AFNO: the adaptive Fourier neural operator (``afno``).

Paper: Guibas et al., "Adaptive Fourier Neural Operators: Efficient Token Mixers for Transformers",
ICLR 2022, https://arxiv.org/abs/2111.13587. A real 2-D FFT of the H×W token grid; at every kept frequency a
block-diagonal complex MLP (k blocks of b = C/k channels, hidden width b·f, ReLU), shared by all
frequencies; soft-shrinkage ``S_λ`` of the result (sparsity); the inverse FFT; plus the layer's input (the
paper's code adds it back inside the mixer). Cost N log N; the weights do not depend on the grid.

Hard thresholding (``modes: m``): only the frequencies ``|k_H| < m`` and ``|k_W| < m`` (a low-pass square, at
most ``(2m − 1)·m`` of the half spectrum's entries) pass through the MLP; every other frequency of the output
spectrum is 0, so the mixer returns its input there. ``modes: null`` keeps all of them.

A complex product ``(a + ib)(W_r + iW_i)`` is four real products (the paper's code), computed as one real
matrix product over interleaved (real, imaginary) channels. Prefix tokens (ViT's
class token) are not grid positions: each one's output is the mean of the grid outputs.

FLOPs: the FFTs as in :mod:`vitzoo.attention.token_mixing.gfnet` (two real transforms per channel); the block
MLP at the F kept frequencies (F = H·(⌊W/2⌋+1) without thresholding, ``min(2m − 1, H)·min(m, ⌊W/2⌋+1)`` with
it): 4 real products of F·k·b·bf per layer, two layers: ``8FCbf``; biases, ReLU and shrinkage 0.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, TokenMixer, check, check_positive, check_positive_number
from vitzoo.attention.token_mixing.gfnet import fft_dtype, grid_and_prefix, with_prefix
from vitzoo.costs import Saved, fft_flops, itemsize


@dataclass
class AFNOConfig:
    num_blocks: Optional[int] = 8  # k diagonal blocks of the MLP (the paper's 8; must divide C); null = one per head
    hidden_factor: int = 1  # f: hidden width of each block's MLP is f·C/k (the paper's default 1)
    sparsity: float = 0.01  # λ of the soft-shrinkage (the paper's default)
    modes: Optional[int] = None  # hard thresholding: keep frequencies |k| < modes on each axis; null = all

    def __post_init__(self):
        check_positive(self, "hidden_factor")
        check_positive_number(self, "sparsity")
        for name in ("num_blocks", "modes"):
            if getattr(self, name) is not None:
                check_positive(self, name)


@register_attention("afno", AFNOConfig)
class AdaptiveFourierMixer(TokenMixer):
    """FFT → block-diagonal complex MLP → soft-shrink → inverse FFT, plus the input; cost :attr:`formula`.

    Args:
        cfg: AFNOConfig.
        ctx: dims, heads (the default block count) and prefix tokens.
    """

    formula = "2C·⌊5/4·M·log₂(M) + 1/2⌋ + 8FCbf"
    keeps_input_dtype = True  # returns its input's dtype under autocast (Block.memory reads it)

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

    def kept(self, grid: Grid) -> tuple[int, int]:
        """Rows and columns of the half spectrum ``[H, ⌊W/2⌋+1]`` the MLP reads: all, or with ``modes: m`` the
        ``min(2m − 1, H)`` rows of ``|k_H| < m`` (the first m and the last m − 1) and the first ``min(m, ⌊W/2⌋+1)``."""
        H, W = grid
        m = self.cfg.modes
        return (H, W // 2 + 1) if m is None else (min(2 * m - 1, H), min(m, W // 2 + 1))

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        g, _ = grid_and_prefix(x, self.num_prefix, grid)
        B, H, W, C = g.shape
        k, b = self.blocks, self.block
        rows, cols = self.kept((H, W))
        # FFT over contiguous rows (channel-first), then the blocks as the batch of two matrix products
        spec = torch.fft.rfft2(g.to(fft_dtype(x)).permute(0, 3, 1, 2).contiguous(), norm="ortho")  # [B, C, H, W/2+1]
        wf, m = spec.shape[-1], self.cfg.modes
        if cols < wf:
            spec = spec[..., :cols]  # [B, C, H, cols]: the low k_W
        if rows < H:
            spec = torch.cat([spec[:, :, :m], spec[:, :, H - m + 1:]], dim=2)  # [B, C, 2m − 1, cols]: |k_H| < m
        f = rows * cols  # kept frequencies
        z = torch.view_as_real(spec).reshape(B, k, b, f, 2)  # [B, k, b, F, re/im]
        z = z.permute(1, 0, 3, 2, 4).reshape(k, B * f, 2 * b)  # [k, B·F, (b, re/im)]
        z = self._layer(z, self.w1, self.b1).relu()  # [k, B·F, (bf, re/im)]
        z = _shrink(self._layer(z, self.w2, self.b2), self.cfg.sparsity)  # [k, B·F, (b, re/im)]
        z = z.view(k, B, f, b, 2).permute(1, 0, 3, 2, 4).reshape(B, C, rows, cols, 2)  # [B, C, rows, cols, re/im]
        if rows < H:  # the dropped rows between k_H = m − 1 and k_H = −(m − 1) are 0
            z = torch.cat([z[:, :, :m], z.new_zeros(B, C, H - rows, cols, 2), z[:, :, m:]], dim=2)  # [B, C, H, cols, 2]
        if cols < wf:
            z = F.pad(z, (0, 0, 0, wf - cols))  # [B, C, H, W/2+1, re/im]: the dropped columns are 0
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
        half spectrum, 0 where ``|k_H|`` or ``k_W`` reaches ``modes``, the Hermitian spectrum rebuilt and inverted
        with DFT matrices."""
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
        if self.cfg.modes is not None:  # hard thresholding: frequency |k_H| = min(h, H − h) and k_W = w below modes
            freq_h = torch.minimum(torch.arange(H), H - torch.arange(H))
            low = (freq_h[:, None] < self.cfg.modes) & (torch.arange(wf)[None, :] < self.cfg.modes)  # [H, W/2+1]
            h2 = torch.where(low[None, :, :, None].to(x.device), h2, torch.zeros_like(h2))
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
        rows, cols = self.kept((h, w))
        return {"C": self.dim, "M": h * w, "F": rows * cols, "b": self.block, "f": self.cfg.hidden_factor}

    def flops(self, grid: Optional[Grid] = None) -> int:
        h, w = grid or self.grid
        rows, cols = self.kept((h, w))
        freqs, hid = rows * cols, self.block * self.cfg.hidden_factor
        # rfft2 + irfft2 per channel (real transforms); two layers of 4 real products F·k·b·bf each
        return 2 * self.dim * fft_flops(h * w, real=True) + 8 * freqs * self.blocks * self.block * hid

    def memory(self, grid: Optional[Grid] = None, batch: int = 1, amp: Optional[torch.dtype] = None,
               input_dtype: Optional[torch.dtype] = None) -> list[Saved]:
        """What a training forward keeps: the forward FFT's input (float32), each layer's two matrix-product operands
        (the interleaved frequencies and the real form of the complex weight; autocast copies under ``amp``),
        the ReLU's output and the shrinkage's input (float32: the float32 bias add follows each product).
        Args as :meth:`TokenMixer.memory`."""
        (h, w), c, k, b = grid or self.grid, self.dim, self.blocks, self.block
        rows, cols = self.kept((h, w))
        hid, size, f = b * self.cfg.hidden_factor, itemsize(amp), batch * rows * cols  # f: B·F frequency rows
        items = [
            Saved("rfft2 input (grid tokens, channel-first copy, fp32)", batch * c * h * w, 4),  # [B, C, H, W]
            Saved("layer 1 input (kept frequencies, re/im interleaved)", k * f * 2 * b, size),  # [k, B·F, 2b]
            Saved("layer 1 weight (real form)", k * 2 * b * 2 * hid, size),  # [k, 2b, 2bf]
            Saved("ReLU output (fp32)", k * f * 2 * hid, 4),  # [k, B·F, 2bf]
            Saved("layer 2 weight (real form)", k * 2 * hid * 2 * b, size),  # [k, 2bf, 2b]
            Saved("shrinkage input (layer 2 output, fp32)", k * f * 2 * b, 4),  # [k, B·F, 2b]
        ]
        if amp is not None:
            items.append(Saved("layer 2 input (ReLU output, autocast copy)", k * f * 2 * hid, size))  # [k, B·F, 2bf]
        return items


def _shrink(t: Tensor, lam: float) -> Tensor:
    """Soft-shrinkage ``S_λ(t) = t − clamp(t, −λ, λ)`` (a NaN stays NaN, unlike ``F.softshrink``)."""
    return t - t.clamp(-lam, lam)


def _dft(n: int, sign: int) -> Tensor:
    """``exp(sign·2πi·jk/n)`` as a complex128 matrix ``[n, n]``."""
    idx = torch.arange(n)
    return torch.exp(sign * 2j * torch.pi * (torch.outer(idx, idx) % n).double() / n)
