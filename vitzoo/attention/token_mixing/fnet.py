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

FLOPs convention (fvcore measures FFTs as 0, so this module registers handles in
:attr:`FNetMixing.flop_handles` for ``aten::fft_fft``, ``aten::fft_fft2`` and ``aten::fft_fftn``,
which is what ``torch.fft.fft2`` / ``fftn`` / ``fft`` trace to; ``aten::real`` is a view, 0):
a complex transform over ``M`` points in total (the product of the transformed lengths) costs
``round(5/2 · M · log₂ M)`` multiply-adds — the classic radix-2 ``5·M·log₂M`` real flops, halved to
MACs. This is consistent for transforms over several dims: a 2-D ``N×C`` transform done as C
length-N transforms plus N length-C transforms costs ``5/2·NC·(log₂N + log₂C) = 5/2·M·log₂M``
with ``M = NC``. Every transform is counted as complex (no discount for real input) and the
rounding is applied once per transform, then multiplied by the number of transforms (batch).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from fvcore.nn.jit_handles import get_shape
from torch import Tensor

from vitzoo.attention import register_attention
from vitzoo.attention.base import Grid, TokenMixer, check


def fft_macs(points: int) -> int:
    """Multiply-adds of one complex FFT over ``points`` points in total: ``round(5/2 · M · log₂ M)``."""
    return int(math.floor(2.5 * points * math.log2(points) + 0.5)) if points > 1 else 0


def _constant(value: Any) -> Any:
    """The Python value of a traced constant argument (a ``prim::ListConstruct`` of constants included)."""
    node = value.node()
    if node.kind() == "prim::ListConstruct":
        return [v.toIValue() for v in node.inputs()]
    return value.toIValue()


def fft_flop_jit(inputs: list[Any], outputs: list[Any]) -> int:
    """fvcore handle for ``aten::fft_fft(self, n, dim, norm)``, ``aten::fft_fft2`` and
    ``aten::fft_fftn(self, s, dim, norm)``: transforms × :func:`fft_macs` (points per transform)."""
    out = get_shape(outputs[0])
    dims = _constant(inputs[2])
    if dims is None:  # fftn: all dims, or the last len(s) dims when s is given
        sizes = _constant(inputs[1])
        dims = list(range(len(out) - (len(out) if sizes is None else len(sizes)), len(out)))
    dims = [dims] if isinstance(dims, int) else dims
    points = math.prod(out[d] for d in dims)
    return (math.prod(out) // points) * fft_macs(points)


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

    formula = "5/2·NC·log₂(NC)"
    flop_handles = {"aten::fft_fft": fft_flop_jit, "aten::fft_fft2": fft_flop_jit, "aten::fft_fftn": fft_flop_jit,
                    "aten::real": None}

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
        # one complex 2-D transform over N·C points per image
        return fft_macs(self.seq_len(grid) * self.dim)


def _dft(n: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Real and (negated) imaginary parts of the DFT matrix: ``F_n = cos(2πjk/n) − i·sin(2πjk/n)``."""
    idx = torch.arange(n, dtype=torch.int64, device=device)
    phase = (idx[:, None] * idx[None, :]) % n  # jk mod n keeps the angle in [0, 2π) exactly
    angle = phase.to(torch.float64) * (2 * math.pi / n)
    return torch.cos(angle), torch.sin(angle)
