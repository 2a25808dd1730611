"""GFNet's global filter (``gfnet``).

Paper: Rao et al., "Global Filter Networks for Image Classification", NeurIPS 2021,
https://arxiv.org/abs/2107.00645. ``y = F⁻¹(K ⊙ F(X))``: a real 2-D FFT of the H×W token grid per
channel, an elementwise product with a learned complex filter ``K[H, ⌊W/2⌋+1, C]``, and the inverse
FFT: a depthwise global circular convolution, cost N log N. No projections.

Prefix tokens (ViT's class token) are not grid positions: each one's output is the mean of the
filtered grid tokens (the global-average summary the paper's classifier reads), so a class token
reads the whole image. The filter depends on the grid: the mixer is fixed-length (``interpolate: true``
resamples the filter bilinearly to another grid, as the paper does for larger inputs).

FLOPs: the two FFTs are real transforms (``rfft2``, ``irfft2``) over the M = H·W grid points, one per channel,
``⌊5/4·M·log₂M + 1/2⌋`` each in vitzoo's FFT convention (:func:`vitzoo.costs.fft_flops`, ``docs/flops.md``); the
filter product is one complex product per kept frequency and channel, F = H·(⌊W/2⌋+1) frequencies, 4 real
multiply-adds each (``vitzoo.flops`` measures a product of two complex tensors so).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, MixerContext, TokenMixer, check
from vitzoo.costs import Saved, fft_flops


def fft_dtype(x: Tensor) -> torch.dtype:
    """float64 stays, everything else runs in float32 (FFT kernels: no bf16, fp16 only at 2^k sizes)."""
    return x.dtype if x.dtype == torch.float64 else torch.float32


def grid_and_prefix(x: Tensor, num_prefix: int, grid: Grid) -> tuple[Tensor, Tensor]:
    """``x[B, N, C] -> (grid tokens [B, H, W, C], prefix tokens [B, P, C])``."""
    B, _, C = x.shape
    return x[:, num_prefix:].reshape(B, grid[0], grid[1], C), x[:, :num_prefix]


def rfft_grid(g: Tensor) -> Tensor:
    """Orthonormal ``rfft2`` of channel-last grid tokens ``[B, H, W, C] -> [B, H, ⌊W/2⌋+1, C]`` (complex).

    The transform runs on a channel-first copy, whose H and W dims are contiguous (the FFTs' forward and
    backward take about two thirds of their time on strided dims, on the CPU); the result is a channel-last view.

    Args:
        g: grid tokens ``[B, H, W, C]`` (real).
    """
    spec = torch.fft.rfft2(g.permute(0, 3, 1, 2).contiguous(), norm="ortho")  # [B, C, H, W/2+1]
    return spec.permute(0, 2, 3, 1)  # [B, H, W/2+1, C]


def irfft_grid(z: Tensor, grid: Grid) -> Tensor:
    """Inverse of :func:`rfft_grid`: ``[B, H, ⌊W/2⌋+1, C]`` (complex) ``-> [B, H, W, C]`` (real), on channel-first
    contiguous rows.

    Args:
        z: half spectrum ``[B, H, ⌊W/2⌋+1, C]``.
        grid: the token grid ``(H, W)`` (the output size: W is not recoverable from ⌊W/2⌋+1).
    """
    y = torch.fft.irfft2(z.permute(0, 3, 1, 2).contiguous(), s=tuple(grid), norm="ortho")  # [B, C, H, W]
    return y.permute(0, 2, 3, 1)  # [B, H, W, C]


def with_prefix(y: Tensor, num_prefix: int) -> Tensor:
    """``y[B, H, W, C] -> [B, P + H·W, C]``, each prefix token the mean of the grid outputs."""
    B, H, W, C = y.shape
    y = y.reshape(B, H * W, C)  # [B, HW, C]
    if not num_prefix:
        return y
    return torch.cat([y.mean(dim=1, keepdim=True).expand(B, num_prefix, C), y], dim=1)


@dataclass
class GFNetConfig:
    interpolate: bool = False  # another grid: false = ConfigError; true = resample the filter bilinearly

    def __post_init__(self):
        check(isinstance(self.interpolate, bool), f"attention.interpolate must be a bool (got {self.interpolate!r})")


@register_attention("gfnet", GFNetConfig)
class GlobalFilter(TokenMixer):
    """``F⁻¹(K ⊙ F(X))`` over the token grid per channel; cost :attr:`formula` (M = H·W).

    Args:
        cfg: GFNetConfig.
        ctx: dims, the grid the filter is built for, and prefix tokens.
    """

    formula = "2C·⌊5/4·M·log₂(M) + 1/2⌋ + 4FC"
    keeps_input_dtype = True  # returns its input's dtype under autocast (Block.memory reads it)
    fixed_length = True

    def __init__(self, cfg: GFNetConfig, ctx: MixerContext):
        super().__init__(cfg, ctx)
        h, w = ctx.grid
        self.filter = nn.Parameter(torch.randn(h, w // 2 + 1, ctx.dim, 2) * 0.02)  # K as (real, imag), the paper's init

    def complex_filter(self, grid: Grid) -> Tensor:
        """The filter ``[H, ⌊W/2⌋+1, C]`` (complex) at ``grid``, resampled when it is not the construction grid."""
        self.check_grid(grid)
        k = self.filter
        if tuple(grid) != self.grid:
            size = (grid[0], grid[1] // 2 + 1)
            k = F.interpolate(k.permute(2, 3, 0, 1).flatten(0, 1)[None], size=size, mode="bilinear",
                              align_corners=True)[0]  # [2C, H', W'/2+1]
            k = k.unflatten(0, (self.dim, 2)).permute(2, 3, 0, 1)  # [H', W'/2+1, C, 2]
        return torch.view_as_complex(k.contiguous())

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        g, _ = grid_and_prefix(x, self.num_prefix, grid)
        spec = rfft_grid(g.to(fft_dtype(x)))  # [B, H, W/2+1, C]
        y = irfft_grid(spec * self.complex_filter(grid), grid)  # [B, H, W, C]: 4FC for the complex product
        return with_prefix(y.to(x.dtype), self.num_prefix)  # [B, N, C]

    def reference(self, x: Tensor, grid: Grid) -> Tensor:
        """The circular convolution written out: the kernel is the inverse DFT of the Hermitian-extended filter."""
        H, W = grid
        k = torch.view_as_complex(self.filter.double().contiguous())  # [H, W/2+1, C]
        full = torch.zeros(H, W, self.dim, dtype=torch.complex128, device=x.device)
        wf = W // 2 + 1
        full[:, :wf] = k
        for c in range(wf, W):  # Hermitian symmetry of a real signal's spectrum: K[h, c] = conj(K[-h, W - c])
            full[:, c] = k[(-torch.arange(H)) % H, W - c].conj()
        if W % 2 == 0:  # the Nyquist column (and the zero column) of a real spectrum: real parts only
            full[:, W // 2] = (k[:, W // 2] + k[(-torch.arange(H)) % H, W // 2].conj()) / 2
        full[:, 0] = (k[:, 0] + k[(-torch.arange(H)) % H, 0].conj()) / 2
        kernel = _idft2(full)  # [H, W, C]
        g = x[:, self.num_prefix:].to(torch.float64).reshape(x.shape[0], H, W, self.dim)
        y = torch.zeros_like(g)
        for a in range(H):
            for b in range(W):  # y[i, j] = Σ_ab kernel[a, b] · g[i − a, j − b] (circular)
                y = y + kernel[a, b].real * torch.roll(g, shifts=(a, b), dims=(1, 2))
        return with_prefix(y, self.num_prefix).to(x.dtype)

    def symbols(self, grid: Optional[Grid] = None) -> dict[str, int]:
        h, w = grid or self.grid
        return {"C": self.dim, "M": h * w, "F": h * (w // 2 + 1)}

    def flops(self, grid: Optional[Grid] = None) -> int:
        h, w = grid or self.grid
        # rfft2 and irfft2, one per channel; the filter: 4 real multiply-adds per complex product at F·C points
        return 2 * self.dim * fft_flops(h * w, real=True) + 4 * h * (w // 2 + 1) * self.dim

    def memory(self, grid: Optional[Grid] = None, batch: int = 1, amp: Optional[torch.dtype] = None,
               input_dtype: Optional[torch.dtype] = None) -> list[Saved]:
        """What a training forward keeps, the same in fp32 and under ``amp`` (the FFTs run in float32): the forward
        transform's input, the spectrum the filter product reads and, at another grid, the resampled filter.
        Args as :meth:`TokenMixer.memory`."""
        grid = grid or self.grid
        (h, w), c = grid, self.dim
        freqs = h * (w // 2 + 1)  # the half spectrum's frequencies
        items = [Saved("rfft2 input (grid tokens, channel-first copy, fp32)", batch * c * h * w, 4),  # [B, C, H, W]
                 Saved("spectrum (complex64)", batch * freqs * c, 8)]  # [B, H, W/2+1, C]
        if tuple(grid) != self.grid:
            items.append(Saved("filter resampled to the grid (complex64)", freqs * c, 8))  # [H, W/2+1, C]
        return items


def _idft2(spec: Tensor) -> Tensor:
    """Inverse 2-D DFT over the first two dims as explicit DFT-matrix products, scaled by ``1/(HW)``
    (an ``ortho`` forward and inverse transform around a product: ``1/√(HW)`` twice)."""
    H, W = spec.shape[:2]
    fh = torch.exp(2j * math.pi * torch.outer(torch.arange(H), torch.arange(H)).double() / H)
    fw = torch.exp(2j * math.pi * torch.outer(torch.arange(W), torch.arange(W)).double() / W)
    return torch.einsum("ah,bw,hwc->abc", fh, fw, spec.to(torch.complex128)) / (H * W)
