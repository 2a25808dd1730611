"""FNet: the real part of a 2-D discrete Fourier transform over tokens and channels.

Paper: Lee-Thorp et al., "FNet: Mixing Tokens with Fourier Transforms", NAACL 2022,
https://arxiv.org/abs/2105.03824.

``y = Re(F_N · X · F_C)`` with ``X [N, C]`` and ``F_n[j, k] = exp(-2πi·jk/n)``; no parameters.
Prefix tokens (ViT's class token) are simply tokens along the token axis (index 0 of the
transform): the class token is mixed with every grid token and vice versa, position-blind like
every other token.

Normalisation: the paper's FNet is post-LN and uses the unnormalised transform (``norm:
backward``). vitzoo's blocks are pre-norm (``x + mix(LN(x))``), where an unnormalised transform
would add a residual √(NC) times larger than the input; the default ``norm: ortho`` scales by
``1/√(NC)`` (a scaling, 0 MACs).

FLOPs: the input is real, so the transform is a real one (torch computes the half spectrum and
mirrors it): ``⌊5/4·M·log₂M + 1/2⌋`` multiply-adds over its ``M = N·C`` points, vitzoo's FFT convention
(:func:`vitzoo.costs.fft_flops`, ``docs/flops.md``), which ``vitzoo.flops``'s handles for every ``aten::fft_*`` op
measure alike; taking the real part is a view (0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, TokenMixer, check
from vitzoo.costs import Saved, fft_flops


@dataclass
class FNetConfig:
    norm: str = "ortho"  # "ortho" (scale 1/√(NC), for pre-norm blocks) or "backward" (unscaled, the paper)

    def __post_init__(self):
        check(self.norm in ("ortho", "backward"), f"attention.norm must be 'ortho' or 'backward' (got {self.norm!r})")


@register_attention("fnet", FNetConfig)
class FNetMixing(TokenMixer):
    """Parameter-free Fourier token mixing; its cost is :attr:`formula` (see the module docstring).

    Args:
        cfg: :class:`FNetConfig`.
        ctx: host dims (the grid only matters through N at call time).
    """

    sequence_capable = True  # the output depends on the tokens as a sequence only
    formula = "⌊5/4·NC·log₂(NC) + 1/2⌋"
    keeps_input_dtype = True  # returns its input's dtype under autocast (Block.memory reads it)

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        xf = x if x.dtype in (torch.float32, torch.float64) else x.float()  # FFT kernels: no bf16, fp16 only 2^k
        return torch.fft.fft2(xf, dim=(-2, -1), norm=self.cfg.norm).real.to(x.dtype)  # [B, N, C]

    def reference(self, x: Tensor, grid: Grid) -> Tensor:
        """Explicit real DFT matrices in float64: ``Re(F_N X F_C) = cos_N X cos_C − sin_N X sin_C``."""
        n, c = x.shape[-2:]
        cos_n, sin_n = _dft(n, x.device)
        cos_c, sin_c = _dft(c, x.device)
        x64 = x.to(torch.float64)
        y = cos_n @ x64 @ cos_c - sin_n @ x64 @ sin_c
        if self.cfg.norm == "ortho":
            y = y / math.sqrt(n * c)
        return y.to(x.dtype)

    def flops(self, grid: Optional[Grid] = None) -> int:
        # one 2-D transform of a real input over N·C points per image
        return fft_flops(self.seq_len(grid) * self.dim, real=True)

    def memory(self, grid: Optional[Grid] = None, batch: int = 1, amp: Optional[torch.dtype] = None,
               input_dtype: Optional[torch.dtype] = None) -> list[Saved]:
        """Nothing: the FFT, the real part (a view) and the dtype casts keep no tensor for backward.
        Args as :meth:`TokenMixer.memory`."""
        return []


def _dft(n: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Real and (negated) imaginary parts of the DFT matrix: ``F_n = cos(2πjk/n) − i·sin(2πjk/n)``."""
    idx = torch.arange(n, dtype=torch.int64, device=device)
    phase = (idx[:, None] * idx[None, :]) % n  # jk mod n keeps the angle in [0, 2π) exactly
    angle = phase.to(torch.float64) * (2 * math.pi / n)
    return torch.cos(angle), torch.sin(angle)
