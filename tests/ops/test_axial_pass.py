"""Axial attention's pass as one autograd node (:mod:`vitzoo.ops.axial`): the same outputs and gradients as the
per-line SDPA it replaces in CPU training, gradients against finite differences, and which calls take it."""
from __future__ import annotations

import pytest
import torch
from conftest import make_attention

from vitzoo.ops import axial as axial_ops
from vitzoo.ops import dispatch, select


def _step(attn, x, grid):
    """Output, input gradient and parameter gradients of one training step with a fixed output gradient."""
    x = x.detach().requires_grad_()
    attn.zero_grad()
    out = attn(x, grid)
    out.backward(torch.linspace(-1.0, 1.0, out.numel(), dtype=out.dtype).view_as(out))
    return out.detach(), x.grad, {name: p.grad.clone() for name, p in attn.named_parameters()}


@pytest.mark.parametrize("grid,prefix,heads", [((3, 4), 1, 4), ((4, 2), 2, 1), ((2, 5), 0, 2)])
def test_the_node_matches_the_per_line_sdpa(grid, prefix, heads, monkeypatch):
    torch.manual_seed(0)
    attn = make_attention("axial", grid, prefix, heads=heads).double().train()
    x = torch.randn(2, prefix + grid[0] * grid[1], 32, dtype=torch.float64)
    calls = []
    monkeypatch.setattr(axial_ops, "line_pass", lambda *a: calls.append(a) or axial_ops.AxialPass.apply(*a))
    fast = _step(attn, x, grid)
    assert len(calls) == 2  # the row pass and the column pass
    monkeypatch.setitem(dispatch.TABLE, "axial_pass", (("sdpa", lambda *a: True),))
    plain = _step(attn, x, grid)
    torch.testing.assert_close(fast[0], plain[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fast[1], plain[1], rtol=1e-12, atol=1e-12)
    for name in fast[2]:
        torch.testing.assert_close(fast[2][name], plain[2][name], rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.parametrize("rows", [True, False])
@pytest.mark.parametrize("prefix", [0, 2])
def test_gradients_match_finite_differences(rows, prefix):
    torch.manual_seed(0)
    grid, heads = (3, 2), 2
    qkv = torch.randn(2, prefix + 6, 3 * 8, dtype=torch.float64, requires_grad=True)  # [B, N, 3C], d = 4
    assert torch.autograd.gradcheck(lambda t: axial_ops.line_pass(t, heads, grid, prefix, rows), (qkv,))


def test_a_non_finite_query_leaves_its_row_non_finite():
    qkv = torch.randn(1, 1 + 6, 12, requires_grad=True)  # [B, N, 3C], C = 4, one head
    with torch.no_grad():
        qkv[0, 3, 0] = float("nan")  # a query channel of grid token 2 (row 0)
    out = axial_ops.line_pass(qkv, 1, (2, 3), 1, True)
    assert not out[0, 3].isfinite().any() and out[0, 5].isfinite().all()


def test_axial_pass_dispatch():
    """CPU training without dropout takes the node; dropout, inference and tracing the per-line SDPA."""
    qkv = torch.zeros(1, 7, 12, requires_grad=True)
    assert select("axial_pass", qkv, 0.0) == "autograd_function"
    assert select("axial_pass", qkv, 0.1) == "sdpa"
    assert select("axial_pass", qkv.detach(), 0.0) == "sdpa"
    with torch.no_grad():
        assert select("axial_pass", qkv, 0.0) == "sdpa"
    seen = []

    def probe(t):
        seen.append(select("axial_pass", t, 0.0))
        return t * 2

    torch.jit.trace(probe, qkv, check_trace=False)
    assert seen == ["sdpa"]
