"""GFNet's global filter and AFNO (with and without hard thresholding) against numpy's FFT, their grid handling
and options."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_attention

from vitzoo.attention import ConfigError, attention_config


def test_gfnet_is_numpys_filtered_fft():
    torch.manual_seed(0)
    attn = make_attention("gfnet", (6, 5), 1).double()
    x = torch.randn(2, 31, 32, dtype=torch.float64)
    g = x[:, 1:].reshape(2, 6, 5, 32).numpy()
    k = attn.filter.detach().numpy()
    spec = np.fft.rfft2(g, axes=(1, 2), norm="ortho") * (k[..., 0] + 1j * k[..., 1])
    y = np.fft.irfft2(spec, s=(6, 5), axes=(1, 2), norm="ortho").reshape(2, 30, 32)
    out = attn(x, (6, 5)).detach().numpy()
    np.testing.assert_allclose(out[:, 1:], y, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out[:, 0], y.mean(axis=1), rtol=1e-10, atol=1e-12)  # class token: grid mean


def test_gfnet_at_another_grid_needs_interpolate():
    attn = make_attention("gfnet", (4, 4), 1)
    with pytest.raises(ConfigError, match="attention=gfnet is built for a 4x4 token grid.*attention.interpolate"):
        attn(torch.randn(1, 37, 32), (6, 6))
    resampled = make_attention("gfnet", (4, 4), 1, interpolate=True)
    assert resampled(torch.randn(1, 37, 32), (6, 6)).shape == (1, 37, 32)
    x = torch.randn(1, 17, 32)
    torch.testing.assert_close(resampled(x, (4, 4)), resampled.reference(x, (4, 4)), rtol=1e-4, atol=1e-5)


def test_afno_with_everything_shrunk_returns_its_input():
    """A shrinkage threshold above every MLP output zeroes the spectrum: the mixer adds only its input."""
    torch.manual_seed(0)
    attn = make_attention("afno", (4, 6), 1, sparsity=1e3).double()
    x = torch.randn(2, 25, 32, dtype=torch.float64)
    out = attn(x, (4, 6))
    torch.testing.assert_close(out[:, 1:], x[:, 1:])
    torch.testing.assert_close(out[:, 0], x[:, 1:].mean(dim=1))


@pytest.mark.parametrize("blocks,factor", [(8, 1), (2, 2), (None, 3)])
def test_afno_block_options_match_reference(blocks, factor):
    torch.manual_seed(0)
    attn = make_attention("afno", (5, 6), 1, num_blocks=blocks, hidden_factor=factor).double()
    assert attn.blocks == (blocks or 4) and attn.w1.shape[-1] == attn.block * factor
    x = torch.randn(2, 31, 32, dtype=torch.float64)
    torch.testing.assert_close(attn(x, (5, 6)), attn.reference(x, (5, 6)), rtol=1e-6, atol=1e-8)


def numpy_afno(attn, x: np.ndarray, grid) -> np.ndarray:
    """AFNO written with numpy's FFT: the block MLP in complex arithmetic at the frequencies |k_H| < modes and
    k_W < modes (all without modes), 0 elsewhere, soft-shrinkage of real and imaginary parts, the inverse FFT,
    plus the input; the class token takes the mean of the grid outputs."""
    (H, W), P, k = grid, attn.num_prefix, attn.blocks
    g = x[:, P:].reshape(x.shape[0], H, W, -1)
    spec = np.fft.rfft2(g, axes=(1, 2), norm="ortho")  # [B, H, W/2+1, C]
    z = spec.reshape(*spec.shape[:3], k, -1)  # [B, H, W/2+1, k, b]
    w1, b1, w2, b2 = (p.detach().numpy() for p in (attn.w1, attn.b1, attn.w2, attn.b2))
    h1 = np.einsum("nhwki,kio->nhwko", z, w1[0] + 1j * w1[1]) + (b1[0] + 1j * b1[1])
    h1 = np.maximum(h1.real, 0) + 1j * np.maximum(h1.imag, 0)
    h2 = np.einsum("nhwki,kio->nhwko", h1, w2[0] + 1j * w2[1]) + (b2[0] + 1j * b2[1])
    lam = attn.cfg.sparsity
    h2 = (np.sign(h2.real) * np.maximum(np.abs(h2.real) - lam, 0)
          + 1j * np.sign(h2.imag) * np.maximum(np.abs(h2.imag) - lam, 0))
    if attn.cfg.modes is not None:
        kh = np.abs(np.fft.fftfreq(H) * H)  # |k_H| of each row: 0, 1, …, then the negative frequencies
        kw = np.arange(W // 2 + 1)
        h2 = h2 * ((kh[:, None] < attn.cfg.modes) & (kw[None, :] < attn.cfg.modes))[None, :, :, None, None]
    y = np.fft.irfft2(h2.reshape(spec.shape), s=(H, W), axes=(1, 2), norm="ortho") + g
    y = y.reshape(x.shape[0], H * W, -1)
    return np.concatenate([np.repeat(y.mean(axis=1, keepdims=True), P, axis=1), y], axis=1)


@pytest.mark.parametrize("modes", [None, 1, 2, 3, 9])
@pytest.mark.parametrize("grid,prefix", [((5, 6), 1), ((4, 8), 0), ((7, 3), 2)])
def test_afno_with_hard_thresholding_is_numpys(modes, grid, prefix):
    torch.manual_seed(0)
    attn = make_attention("afno", grid, prefix, modes=modes, sparsity=0.005).double()
    x = torch.randn(2, prefix + grid[0] * grid[1], 32, dtype=torch.float64)
    expected = numpy_afno(attn, x.numpy(), grid)
    np.testing.assert_allclose(attn(x, grid).detach().numpy(), expected, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(attn.reference(x, grid).detach().numpy(), expected, rtol=1e-9, atol=1e-11)


def test_afno_modes_leave_the_high_frequencies_of_the_input_alone():
    """With modes 1 only the mean (k = 0) passes through the MLP: the mixer changes every token by one vector."""
    torch.manual_seed(0)
    attn = make_attention("afno", (4, 6), 0, modes=1).double()
    x = torch.randn(1, 24, 32, dtype=torch.float64)
    delta = attn(x, (4, 6)) - x
    torch.testing.assert_close(delta, delta[:, :1].expand_as(delta))
    assert delta.abs().max() > 0


def test_afno_defaults_to_the_papers_eight_blocks():
    attn = make_attention("afno", (4, 4), 1)
    assert attn.blocks == 8 and attn.block == 4 and attn.cfg.modes is None


@pytest.mark.parametrize("spec,match", [
    ({"name": "afno", "num_blocks": 0}, "attention.num_blocks must be a positive integer"),
    ({"name": "afno", "sparsity": 0}, "attention.sparsity must be a positive number"),
    ({"name": "afno", "hidden_factor": 0}, "attention.hidden_factor must be a positive integer"),
    ({"name": "afno", "modes": 0}, "attention.modes must be a positive integer"),
    ({"name": "afno", "modes": 1.5}, "attention.modes must be a positive integer"),
    ({"name": "gfnet", "interpolate": 1}, "attention.interpolate must be a bool"),
])
def test_bad_options_are_one_line_config_errors(spec, match):
    with pytest.raises(ConfigError, match=match):
        attention_config(spec)


def test_afno_blocks_must_divide_the_channels():
    with pytest.raises(ConfigError, match=r"attention.num_blocks \(5\) must divide model.embed_dim \(32\)"):
        make_attention("afno", (4, 4), 0, num_blocks=5)
