"""Longformer's pattern from the paper's coordinates, sharing no code with the backend: a grid query at (r, c)
sees the keys (r + a·δ, c + b·δ) with |a|, |b| <= k//2 that lie inside the grid (windows masked at the border,
not shifted; δ = 1 on sliding heads, the dilation on dilated heads), the class token and the learned global
tokens. Checked both ways by perturbing one key at a time: every allowed key moves the query's output, no other
key does (learned per-layer tokens read every token before they are keys, so the window checks run with the
class token as the only global token). Without any global token on a Swin grid the backend refuses in one line."""
from __future__ import annotations

import pytest
import torch
from conftest import make_attention
from helpers import pattern_mismatch, reached_keys

from vitzoo.attention import ConfigError

GRID, PREFIX, K = (7, 9), 1, 3


def allowed_keys(grid, kernel: int, dilation: int) -> torch.Tensor:
    """``[L, L]`` booleans from coordinates: query (r, c) sees (r + a·δ_r, c + b·δ_c), |a|, |b| <= k//2, inside
    the grid; δ per axis is the dilation, or side // k where k·δ does not fit that side (the documented rule)."""
    H, W = grid
    d_r = dilation if kernel * dilation <= H else H // kernel
    d_c = dilation if kernel * dilation <= W else W // kernel
    allowed = torch.zeros(H * W, H * W, dtype=torch.bool)
    half = kernel // 2
    for r in range(H):
        for c in range(W):
            for a in range(-half, half + 1):
                for b in range(-half, half + 1):
                    kr, kc = r + a * d_r, c + b * d_c
                    if 0 <= kr < H and 0 <= kc < W:
                        allowed[r * W + c, kr * W + kc] = True
    return allowed


def reached(attn, grid, prefix: int) -> torch.Tensor:
    """``[L, prefix + L]``: which input tokens move each grid query's output (one token perturbed at a time)."""
    x = torch.randn(1, prefix + grid[0] * grid[1], 32, dtype=torch.float64)
    return reached_keys(lambda batch: attn(batch, grid), x)[0, prefix:]


@pytest.mark.parametrize("dilated_heads,dilation", [(0, 1), (4, 2), (4, 3)])
def test_longformer_sees_exactly_the_paper_window(dilated_heads, dilation):
    torch.manual_seed(0)
    attn = make_attention("longformer", GRID, PREFIX, kernel_size=K, dilated_heads=dilated_heads,
                          dilation=dilation, num_global=1).double().eval()
    seen = reached(attn, GRID, PREFIX)
    assert seen[:, :PREFIX].all(), "a grid query does not see the class token"
    expected = allowed_keys(GRID, K, dilation if dilated_heads else 1)
    assert not (mismatch := pattern_mismatch(seen[:, PREFIX:], expected)), mismatch


def test_longformer_mixed_heads_see_the_union():
    """Two sliding and two dilated heads: a query sees the union of both windows (through the output projection)."""
    torch.manual_seed(0)
    attn = make_attention("longformer", GRID, PREFIX, kernel_size=K, dilated_heads=2, dilation=2,
                          num_global=1).double().eval()
    expected = allowed_keys(GRID, K, 1) | allowed_keys(GRID, K, 2)
    assert torch.equal(reached(attn, GRID, PREFIX)[:, PREFIX:], expected)


def test_longformer_without_global_tokens_on_swin_is_one_line():
    with pytest.raises(ConfigError, match=r"attention=longformer needs a global token") as err:
        make_attention("longformer", (8, 8), 0, num_global=0, global_tokens="per_layer")
    assert "\n" not in str(err.value)
    make_attention("longformer", (8, 8), 1, num_global=0, global_tokens="per_layer")  # the class token is global
