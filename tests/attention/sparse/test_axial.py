"""Axial attention against a per-query loop written from the papers' equations, its options and its FLOPs."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import Host, make_attention

from vitzoo.attention import ConfigError, attention_config, dense_attention
from vitzoo.flops import flop_analysis


def project(linear: torch.nn.Linear, t: torch.Tensor, heads: int) -> list[torch.Tensor]:
    """``t[N, C] @ Wᵀ + b`` split into q, k, v, each ``[heads, N, d]``."""
    out = t @ linear.weight.T + linear.bias
    n, c = t.shape
    return [out[:, i * c:(i + 1) * c].reshape(n, heads, c // heads).transpose(0, 1) for i in range(3)]


def keys_of(i: int, prefix: int, grid, axis: str, with_prefix: bool = True) -> list[int]:
    """The keys query ``i`` scores in one axial pass: a prefix query every token, a grid query its row or column
    (and the prefix tokens)."""
    H, W = grid
    if i < prefix:
        return list(range(prefix + H * W))
    r, c = divmod(i - prefix, W)
    line = [prefix + r * W + j for j in range(W)] if axis == "row" else [prefix + a * W + c for a in range(H)]
    return (list(range(prefix)) if with_prefix else []) + line


def one_pass(q, k, v, prefix: int, grid, axis: str, with_prefix: bool = True) -> torch.Tensor:
    """``y_i = Σ_j softmax_j(q_i·k_j/√d) v_j`` over the keys of each query, one query and head at a time."""
    heads, n, d = q.shape
    out = torch.zeros(heads, n, v.shape[-1], dtype=q.dtype)
    for head in range(heads):
        for i in range(n):
            keys = keys_of(i, prefix, grid, axis, with_prefix)
            scores = torch.stack([q[head, i] @ k[head, j] for j in keys]) / math.sqrt(d)
            weights = torch.exp(scores - scores.max())
            weights = weights / weights.sum()
            out[head, i] = sum(w * v[head, j] for w, j in zip(weights, keys))
    return out


def naive_axial(attn, x: torch.Tensor, grid) -> torch.Tensor:
    """Ho et al.'s axial layers for one image ``x[N, C]``: a row attention layer with its own Q/K/V, then a
    column attention layer with its own Q/K/V on the row layer's (concatenated) output, then the output
    projection; ``shared``: the column layer scores the row layer's q and k and averages its outputs."""
    P, h = attn.num_prefix, attn.num_heads
    n, c = x.shape
    q, k, v = project(attn.qkv, x, h)
    rows = one_pass(q, k, v, P, grid, "row")  # [h, N, d]
    if attn.cfg.projections == "separate":
        q, k, v = project(attn.qkv_col, rows.transpose(0, 1).reshape(n, c), h)
        out = one_pass(q, k, v, P, grid, "column")
    else:
        out = one_pass(q, k, rows, P, grid, "column", with_prefix=False)
        out[:, :P] = rows[:, :P]  # a prefix token keeps its row-pass read of all N tokens
    return out.transpose(0, 1).reshape(n, c) @ attn.proj.weight.T + attn.proj.bias


@pytest.mark.parametrize("projections", ["separate", "shared"])
@pytest.mark.parametrize("grid,prefix", [((3, 4), 1), ((2, 5), 0), ((4, 2), 2)])
def test_matches_the_per_query_loop(projections, grid, prefix):
    torch.manual_seed(0)
    attn = make_attention("axial", grid, prefix, projections=projections).double().eval()
    for lin in (attn.qkv, attn.proj, getattr(attn, "qkv_col", attn.proj)):
        torch.nn.init.normal_(lin.bias, std=0.5)  # non-zero biases: the oracle must apply them
    x = torch.randn(2, prefix + grid[0] * grid[1], 32, dtype=torch.float64)
    with torch.no_grad():
        fast = attn(x, grid)
        expected = torch.stack([naive_axial(attn, xi, grid) for xi in x])
    torch.testing.assert_close(fast, expected, rtol=1e-9, atol=1e-11)


def test_the_column_pass_has_its_own_projection():
    """separate: the column pass's q/k/v come from qkv_col, so changing it changes the output; shared has none."""
    torch.manual_seed(0)
    attn = make_attention("axial", (3, 4), 1).double().eval()
    x = torch.randn(1, 13, 32, dtype=torch.float64)
    before = attn(x, (3, 4))
    with torch.no_grad():
        attn.qkv_col.weight.mul_(2.0)
    assert not torch.allclose(attn(x, (3, 4)), before)
    assert not hasattr(make_attention("axial", (3, 4), 1, projections="shared"), "qkv_col")


def test_shared_single_row_is_softmax_attention():
    """On a 1×W grid each column holds one token, so the shared column pass returns the row pass: global attention."""
    torch.manual_seed(0)
    attn = make_attention("axial", (1, 6), 0, projections="shared").double()
    q, k, v = (torch.randn(2, 4, 6, 8, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(attn.attend(q, k, v, (1, 6)), dense_attention(q, k, v))


def test_class_token_attends_to_all_tokens_in_the_row_pass():
    torch.manual_seed(0)
    attn = make_attention("axial", (3, 4), 1).double()
    q, k, v = (torch.randn(1, 4, 13, 8, dtype=torch.float64) for _ in range(3))
    out = attn.line_attention(q, k, v, (3, 4), rows=True)
    torch.testing.assert_close(out[:, :, :1], dense_attention(q[:, :, :1], k, v))


@pytest.mark.parametrize("projections", ["separate", "shared"])
def test_two_passes_reach_the_whole_grid(projections):
    """Every grid token's output depends on every grid token (row, then column)."""
    torch.manual_seed(0)
    attn = make_attention("axial", (4, 5), 0, projections=projections).double()
    x = torch.randn(1, 20, 32, dtype=torch.float64, requires_grad=True)
    jac = torch.autograd.functional.jacobian(lambda t: attn(t, (4, 5))[0, 0].sum(), x)  # token (0, 0)
    assert (jac[0].abs().sum(-1) > 0).all()


# N = 7 (a 2×3 grid and a class token), C = 32: 7NC² = 7·7·1024 = 50176, rows and columns
# 2HW(H + W + 2P)C = 2·6·7·32 = 2688, prefix 4PNC = 4·7·32 = 896; shared: 4NC² = 28672,
# 2HW(H + W + P)C = 2·6·6·32 = 2304, 2PNC = 448
@pytest.mark.parametrize("projections,expected", [("separate", 50176 + 2688 + 896), ("shared", 28672 + 2304 + 448)])
def test_flops_are_hand_computed_and_measured(projections, expected):
    attn = make_attention("axial", (2, 3), 1, projections=projections).eval()
    assert attn.flops((2, 3)) == expected
    with torch.no_grad():
        assert flop_analysis(Host(attn, (2, 3)), (torch.zeros(1, 7, 32),)).by_module()["attn"] == expected


def test_bad_projections_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match=r"^attention.projections must be one of separate, shared \(got 'both'\)$"):
        attention_config({"name": "axial", "projections": "both"})
