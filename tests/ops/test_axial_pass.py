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


@pytest.mark.parametrize("grid,prefix,heads,step", [((3, 4), 1, 4, None), ((4, 2), 2, 1, None), ((2, 5), 0, 2, None),
                                                    ((3, 4), 1, 4, 2), ((4, 3), 2, 2, 1)])
@pytest.mark.parametrize("node", ["line_pass", "projected_line_pass"])
def test_the_node_matches_the_per_line_sdpa(grid, prefix, heads, step, node, monkeypatch):
    """Both nodes, in one fused call per pass (the default at these sizes) and in groups of ``step`` lines; the
    projected node where a pass runs in several calls (here forced by the lines per call)."""
    torch.manual_seed(0)
    attn = make_attention("axial", grid, prefix, heads=heads).double().train()
    x = torch.randn(2, prefix + grid[0] * grid[1], 32, dtype=torch.float64)
    calls, fn = [], getattr(axial_ops, node)
    monkeypatch.setattr(axial_ops, node, lambda *a, **kw: calls.append(a) or fn(*a, step=step))
    if node == "projected_line_pass":
        monkeypatch.setattr(axial_ops, "lines_per_call", lambda *a: 1)
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
@pytest.mark.parametrize("step", [None, 2])
def test_gradients_match_finite_differences(rows, prefix, step):
    torch.manual_seed(0)
    grid, heads = (3, 2), 2
    qkv = torch.randn(2, prefix + 6, 3 * 8, dtype=torch.float64, requires_grad=True)  # [B, N, 3C], d = 4
    assert torch.autograd.gradcheck(lambda t: axial_ops.line_pass(t, heads, grid, prefix, rows, step), (qkv,))


def test_lines_per_call_bounds_the_copied_keys_per_image():
    """A call copies at most 2¹⁶ key elements per image (one line at least): the CIFAR grid in one call, a
    64 × 64 grid in groups."""
    assert axial_ops.lines_per_call(192, 8, 1) >= 8  # vit_cifar at 32 px: one call per pass
    step = axial_ops.lines_per_call(128, 64, 1)
    assert 1 <= step < 64 and step * 65 * 128 <= 1 << 16 < (step + 1) * 65 * 128
    assert axial_ops.lines_per_call(1 << 16, 64, 1) == 1


def test_a_non_finite_query_leaves_its_row_non_finite():
    qkv = torch.randn(1, 1 + 6, 12, requires_grad=True)  # [B, N, 3C], C = 4, one head
    with torch.no_grad():
        qkv[0, 3, 0] = float("nan")  # a query channel of grid token 2 (row 0)
    out = axial_ops.line_pass(qkv, 1, (2, 3), 1, True)
    assert not out[0, 3].isfinite().any() and out[0, 5].isfinite().all()


@pytest.mark.parametrize("amp", [None, torch.bfloat16])
def test_the_projected_node_matches_the_linear_and_node_under_autocast(amp):
    """Outputs and every gradient of the projected node equal those of ``F.linear`` then the node (bf16
    autocast included: the same casts, the weight's gradient in its own dtype)."""
    torch.manual_seed(0)
    x = torch.randn(2, 1 + 12, 16, requires_grad=True)  # [B, N, C]
    lin = torch.nn.Linear(16, 48)
    g = torch.randn(2, 13, 16)
    results = []
    for projected in (False, True):
        x.grad = lin.weight.grad = lin.bias.grad = None
        with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
            if projected:
                out = axial_ops.projected_line_pass(x, lin.weight, lin.bias, 2, (3, 4), 1, False, 2)
            else:
                out = axial_ops.line_pass(lin(x), 2, (3, 4), 1, False, 2)
        out.backward(g.to(out.dtype))
        results.append((out, x.grad, lin.weight.grad, lin.bias.grad))
    tol = {"rtol": 2e-2, "atol": 2e-2} if amp else {"rtol": 1e-5, "atol": 1e-5}
    for fast, plain in zip(*results):
        assert fast.dtype == plain.dtype
        torch.testing.assert_close(fast, plain, **tol)


def test_axial_pass_dispatch():
    """CPU training without dropout takes the node; dropout, inference and tracing the per-line SDPA."""
    x, w = torch.zeros(1, 7, 4, requires_grad=True), torch.zeros(12, 4)
    assert select("axial_pass", x, w, 0.0) == "autograd_function"
    assert select("axial_pass", x.detach(), w.requires_grad_(), 0.0) == "autograd_function"  # a trained projection
    assert select("axial_pass", x, w, 0.1) == "sdpa"
    assert select("axial_pass", x.detach(), w.detach(), 0.0) == "sdpa"
    with torch.no_grad():
        assert select("axial_pass", x, w, 0.0) == "sdpa"
    seen = []

    def probe(t):
        seen.append(select("axial_pass", t, w, 0.0))
        return t * 2

    torch.jit.trace(probe, x, check_trace=False)
    assert seen == ["sdpa"]
