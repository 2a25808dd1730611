"""FFT multiply-adds against hand-computed counts (``round(5/2·M·log₂M)`` per transform over M points).

The expected values are literals worked out by hand, so neither the handles nor the backends' ``flops()``
are checked against the helper they share.
"""
from __future__ import annotations

import pytest
import torch
from conftest import Host, make_attention

from vitzoo.flops import flop_analysis


class Wrap(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, t):
        return self.fn(t)


# M = 32: 5/2·32·5 = 400; M = 6: 5/2·6·2.58496… = 38.77 -> 39; M = 12: 5/2·12·3.58496… = 107.55 -> 108
@pytest.mark.parametrize("fn,shape,expected", [
    (lambda t: torch.fft.fft2(t).real, (2, 8, 4), 2 * 400),  # two 8×4 transforms
    (lambda t: torch.fft.fft(t, dim=1).real, (3, 8, 4), 12 * 60),  # 12 length-8 transforms: 5/2·8·3 = 60
    (lambda t: torch.fft.fftn(t, dim=(0, 1)).real, (2, 3, 5), 5 * 39),  # five 2×3 transforms
    (lambda t: torch.fft.rfft2(t, dim=(1, 2)).real, (1, 4, 8, 3), 3 * 400),  # on the real input: 4×8 points
    (lambda t: torch.fft.irfft2(torch.fft.rfft2(t, dim=(1, 2)), s=(2, 3), dim=(1, 2)), (2, 2, 3, 1), 2 * 39 + 2 * 39),
    (lambda t: torch.fft.rfft(t, dim=-1).real, (5, 12), 5 * 108),
])
def test_fft_handles_count_hand_computed_macs(fn, shape, expected):
    analysis = flop_analysis(Wrap(fn), (torch.zeros(shape),))
    assert analysis.total() == expected and not analysis.unsupported_ops()


@pytest.mark.parametrize("name,grid,prefix,dim,expected", [
    ("fnet", (2, 2), 0, 8, 400),  # one transform over N·C = 32 points
    ("fnet", (2, 3), 0, 2, 108),  # N·C = 12
    ("gfnet", (4, 8), 0, 32, 2 * 32 * 400),  # rfft2 + irfft2 over the 4×8 grid, one per channel
    ("gfnet", (2, 3), 1, 32, 2 * 32 * 39),  # the class token adds nothing
    # afno, 4 heads -> 4 blocks of 8: F = 4·5 = 20 frequencies, 8·F·C·b·f = 8·20·32·8 = 40960
    ("afno", (4, 8), 0, 32, 2 * 32 * 400 + 40960),
])
def test_fourier_mixers_flops_are_hand_computed(name, grid, prefix, dim, expected):
    attn = make_attention(name, grid, prefix, dim=dim, heads=4 if dim % 4 == 0 else 1).eval()
    assert attn.flops(grid) == expected
    x = torch.zeros(1, prefix + grid[0] * grid[1], dim)
    with torch.no_grad():
        assert flop_analysis(Host(attn, grid), (x,)).by_module()["attn"] == expected
