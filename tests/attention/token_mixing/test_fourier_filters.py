"""GFNet's global filter and AFNO against numpy's FFT, their grid handling and options."""
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


@pytest.mark.parametrize("spec,match", [
    ({"name": "afno", "num_blocks": 0}, "attention.num_blocks must be a positive integer"),
    ({"name": "afno", "sparsity": 0}, "attention.sparsity must be a positive number"),
    ({"name": "afno", "hidden_factor": 0}, "attention.hidden_factor must be a positive integer"),
    ({"name": "gfnet", "interpolate": 1}, "attention.interpolate must be a bool"),
])
def test_bad_options_are_one_line_config_errors(spec, match):
    with pytest.raises(ConfigError, match=match):
        attention_config(spec)


def test_afno_blocks_must_divide_the_channels():
    with pytest.raises(ConfigError, match=r"attention.num_blocks \(5\) must divide model.embed_dim \(32\)"):
        make_attention("afno", (4, 4), 0, num_blocks=5)
