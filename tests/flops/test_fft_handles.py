"""FFT and complex-product multiply-adds against hand-computed counts.

Convention: one transform over M points costs ``⌊5/2·M·log₂M + 1/2⌋`` when it is complex and half of it,
``⌊5/4·M·log₂M + 1/2⌋``, when it is real (a real input of a forward transform, a real output of an inverse one);
a product of two complex tensors costs 4 per element. The expected values are literals worked out by hand, so
neither the handles nor the backends' ``flops()`` are checked against the helper they share.
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


def cplx(t: torch.Tensor) -> torch.Tensor:
    return torch.complex(t, t)


# real transforms, 5/4·M·log₂M: M = 8: 10·3 = 30; M = 32: 40·5 = 200; M = 6: 7.5·2.58496… = 19.39 -> 19;
# M = 12: 15·3.58496… = 53.77 -> 54; M = 64: 80·6 = 480
# complex transforms, 5/2·M·log₂M: M = 32: 400; M = 8: 60; M = 30: 75·4.90689… = 368.02 -> 368
@pytest.mark.parametrize("fn,shape,expected", [
    (lambda t: torch.fft.fft2(t).real, (2, 8, 4), 2 * 200),  # fft2 of a real tensor: two real 8×4 transforms
    (lambda t: torch.fft.fft2(cplx(t)).real, (2, 8, 4), 2 * 400),  # of a complex tensor: two complex ones
    (lambda t: torch.fft.fft(t, dim=1).real, (3, 8, 4), 12 * 30),  # 12 real length-8 transforms
    (lambda t: torch.fft.fft(t, n=8, dim=0).real, (5, 3), 3 * 30),  # the input padded to 8 points
    (lambda t: torch.fft.fftn(cplx(t)).real, (2, 3, 5), 368),  # one complex transform over all 30 points
    (lambda t: torch.fft.ifft(cplx(t), dim=0).real, (8, 2), 2 * 60),  # two complex length-8 inverses
    (lambda t: torch.fft.rfft2(t, dim=(1, 2)).real, (1, 4, 8, 3), 3 * 200),  # on the real input: 4×8 points
    (lambda t: torch.fft.rfft2(t, s=(8, 8)).real, (3, 5, 4), 3 * 480),  # padded to 8×8
    (lambda t: torch.fft.irfft2(torch.fft.rfft2(t, dim=(1, 2)), s=(2, 3), dim=(1, 2)), (2, 2, 3, 1), 2 * 19 + 2 * 19),
    (lambda t: torch.fft.rfft(t, dim=-1).real, (5, 12), 5 * 54),
    (lambda t: torch.fft.irfftn(cplx(t), s=(8,), dim=(-1,)), (3, 5), 3 * 30),  # on the real output: 8 points
    (lambda t: torch.fft.hfft(cplx(t), n=8), (3, 5), 3 * 30),  # a real output of 8 points
    (lambda t: torch.fft.ihfft(t).real, (2, 32), 2 * 200),  # a real input of 32 points
    (lambda t: torch.view_as_complex(t) * torch.view_as_complex(t), (4, 3, 2), 4 * 12),  # 12 complex products
    (lambda t: torch.view_as_complex(t) * t[..., 0], (4, 3, 2), 0),  # complex × real: a scaling, 0
    (lambda t: t * t, (4, 3, 2), 0),  # real elementwise: 0
])
def test_fft_handles_count_hand_computed_macs(fn, shape, expected):
    analysis = flop_analysis(Wrap(fn), (torch.zeros(shape),))
    assert analysis.total() == expected and not analysis.unsupported_ops()


@pytest.mark.parametrize("name,grid,prefix,dim,options,expected", [
    ("fnet", (2, 2), 0, 8, {}, 200),  # one real transform over N·C = 32 points
    ("fnet", (2, 3), 0, 2, {}, 54),  # N·C = 12
    # rfft2 + irfft2 over the 4×8 grid, one per channel: 2·32·200 = 12800; filter: F = 4·5 = 20 frequencies,
    # 4·F·C = 4·20·32 = 2560
    ("gfnet", (4, 8), 0, 32, {}, 12800 + 2560),
    # 2·32·19 = 1216 (M = 6); F = 2·2 = 4: 4·4·32 = 512; the class token adds nothing
    ("gfnet", (2, 3), 1, 32, {}, 1216 + 512),
    # afno, 8 blocks of b = 4: 8·F·C·b·f = 8·20·32·4 = 20480
    ("afno", (4, 8), 0, 32, {}, 12800 + 20480),
    # one block per head (4 blocks of 8): 8·20·32·8 = 40960
    ("afno", (4, 8), 0, 32, {"num_blocks": None}, 12800 + 40960),
    # modes 2: rows |k_H| < 2 (3 of 4), columns k_W < 2 (2 of 5): F = 6, 8·6·32·4 = 6144
    ("afno", (4, 8), 0, 32, {"modes": 2}, 12800 + 6144),
    # modes 9 on a 4×8 grid keeps all 20 frequencies
    ("afno", (4, 8), 0, 32, {"modes": 9}, 12800 + 20480),
])
def test_fourier_mixers_flops_are_hand_computed(name, grid, prefix, dim, options, expected):
    attn = make_attention(name, grid, prefix, dim=dim, heads=4 if dim % 4 == 0 else 1, **options).eval()
    assert attn.flops(grid) == expected
    x = torch.zeros(1, prefix + grid[0] * grid[1], dim)
    with torch.no_grad():
        assert flop_analysis(Host(attn, grid), (x,)).by_module()["attn"] == expected
