"""Tests generated from the attention registry: every backend, several grids, with/without class token."""
from __future__ import annotations

import pytest
import torch
from conftest import (
    ATTENTION_NAMES,
    CONFIGS,
    ROOT,
    SHIFT_CASES,
    Host,
    RecordShapes,
    attention_classes,
    backends,
    make_attention,
    token_by_token,
)

from vitzoo.attention import FAMILY_PACKAGES, ConfigError, attention_config, attention_family, list_attention
from vitzoo.flops import flop_analysis

# (grid, prefix tokens): square with a class token, the smallest Swin stage, and a non-square grid
CASES = [((8, 8), 1), ((4, 4), 0), ((6, 10), 0)]


def test_every_backend_lives_in_a_family_with_its_tests():
    """A backend's family is its subpackage; every family has backends and a test folder mirroring it."""
    for name in attention_classes():
        assert attention_family(name) in FAMILY_PACKAGES, f"{name}: defined outside the family subpackages"
    for family in FAMILY_PACKAGES:
        assert backends(family), f"no registered backend of family {family}"
        assert (ROOT / "vitzoo" / "attention" / family / "__init__.py").exists(), family


def test_every_backend_has_a_config_file():
    files = {p.stem for p in (CONFIGS / "attention").glob("*.yaml")}
    assert set(list_attention()) <= files


@pytest.mark.parametrize("grid,prefix", CASES)
def test_shape_and_gradients(attention_name, grid, prefix):
    torch.manual_seed(0)
    attn = make_attention(attention_name, grid, prefix, shifted=True)
    x = torch.randn(2, prefix + grid[0] * grid[1], 32, requires_grad=True)
    y = Host(attn, grid)(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    y.square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for n, p in attn.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"no gradient reaches {n}"


@pytest.mark.parametrize("name,shifted", SHIFT_CASES)
@pytest.mark.parametrize("grid,prefix", CASES)
def test_matches_reference(name, shifted, grid, prefix):
    torch.manual_seed(0)
    attn = make_attention(name, grid, prefix, shifted=shifted).double().eval()
    x = torch.randn(2, prefix + grid[0] * grid[1], 32, dtype=torch.float64)
    with torch.no_grad():
        fast = Host(attn, grid)(x)
        ref = Host(attn, grid, reference=True)(x)
    torch.testing.assert_close(fast, ref, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("grid,prefix", CASES)
def test_flops_measured_equals_analytic(attention_name, grid, prefix):
    attn = make_attention(attention_name, grid, prefix, shifted=True).eval()
    host = Host(attn, grid)
    x = torch.zeros(1, prefix + grid[0] * grid[1], 32)
    with torch.no_grad():
        measured = flop_analysis(host, (x,)).by_module()["attn"]
    assert measured == attn.flops(grid)


def test_eval_is_deterministic(attention_name):
    attn = make_attention(attention_name).eval()
    x = torch.randn(2, 65, 32)
    with torch.no_grad():
        torch.testing.assert_close(Host(attn, (8, 8))(x), Host(attn, (8, 8))(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", [n for n in ATTENTION_NAMES if make_attention(n, (16, 16), 0).grows_linearly])
def test_linear_cost_measured_grows_linearly(name):
    """16x16 -> 64x64 is 16x the tokens: a linear backend's measured FLOPs grow 16x, not ~256x."""
    measured = {}
    for side in (16, 64):
        attn = make_attention(name, (side, side), 0).eval()
        x = torch.zeros(1, side * side, 32)
        with torch.no_grad():
            measured[side] = flop_analysis(Host(attn, (side, side)), (x,)).by_module()["attn"]
    assert measured[64] <= 16 * measured[16] * 1.05, measured


@pytest.mark.parametrize("name", [n for n in ATTENTION_NAMES if make_attention(n, (16, 16), 0).grows_linearly])
def test_linear_cost_never_builds_a_token_by_token_matrix(name):
    """At 32x32 + class token no op in forward or backward returns an N×N-sized tensor."""
    grid, n = (32, 32), 1025
    attn = make_attention(name, grid, 1, shifted=True)
    x = torch.randn(1, n, 32, requires_grad=True)
    with RecordShapes() as rec:
        Host(attn, grid)(x).sum().backward()
    assert not token_by_token(rec.shapes, n), token_by_token(rec.shapes, n)[:3]


def test_unknown_backend_and_options_are_errors():
    with pytest.raises(ConfigError, match="unknown attention 'nope'.*global"):
        attention_config("nope")
    with pytest.raises(ConfigError, match="unknown option attention.bogus"):
        attention_config({"name": "global", "bogus": 1})
    with pytest.raises(ConfigError, match="attention.window_size must be a positive integer"):
        attention_config({"name": "window", "window_size": 0})
