"""Routing's cluster-sorted blocks: the routing heads' fast path equals the dense reference given the naive decision
(balanced, very unbalanced and empty-key clusters, gradients too), its span S follows the decision, ``flops()``
counts with that S, and the fixed-size path (S = nb: compile, export, traces) gives the same result."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import Host, make_attention

import vitzoo.attention.data_driven.routing as routing_module
from vitzoo.attention.data_driven.routing import naive_nearest, routed_reference
from vitzoo.flops import flop_analysis
from vitzoo.flops.formula import evaluate_formula

# (grid, prefix, options): square and non-square, M a multiple of w or not (a padded last block), with and
# without the class token
CASES = [
    ((8, 8), 1, {}),  # K = w = 8: nb·w = M
    ((6, 10), 0, {}),  # K = 8, w = 8: 64 slots for 60 queries
    ((5, 7), 1, {}),  # K = 6, w = 6: 36 slots for 35 queries
    ((6, 10), 1, dict(num_clusters=7)),  # w = 9, nb = 7: 63 slots
    ((3, 4), 0, dict(num_clusters=1)),  # one cluster: nb = 1, S = 1
]


def routing_inputs(attn, grid, prefix, batch=2, seed=0):
    """The routing heads' grid and prefix q, k, v (float64, leaves that need a gradient)."""
    torch.manual_seed(seed)
    x = torch.randn(batch, prefix + grid[0] * grid[1], 32, dtype=torch.float64)
    q, k, v = (t.detach()[:, attn.local_heads:] for t in attn.split_heads(x))
    return split(q, prefix), split(k, prefix), split(v, prefix)


def split(t, prefix):
    return t[:, :, prefix:].clone().requires_grad_(), t[:, :, :prefix].clone().requires_grad_()


def compare(attn, grid, q, k, v):
    """Fast path and reference on the same leaves: outputs and the gradients of q, k, v and the prefix keys/values."""
    (qg, _), (kg, kp), (vg, vp) = q, k, v
    leaves = [qg, kg, vg, kp, vp]
    w = attn.cluster_size(grid)
    fast = attn.routed(qg, kg, vg, kp, vp, w, grid, update=False)
    c_q, c_k = naive_nearest(qg.detach(), attn.centroids), naive_nearest(kg.detach(), attn.centroids)
    ref = routed_reference(qg, kg, vg, kp, vp, c_q, c_k)
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-12)
    g = torch.randn_like(fast)
    grads_fast = torch.autograd.grad(fast, leaves, g, allow_unused=True)
    grads_ref = torch.autograd.grad(ref, leaves, g, allow_unused=True)
    for a, b in zip(grads_fast, grads_ref):
        if b is None or b.numel() == 0:
            continue
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    return c_q, c_k


def expected_span(c_q, c_k, w, num_clusters):
    """S = ⌈max(hi - lo)/w⌉ (at least 1) over images, heads and query blocks, with plain Python loops."""
    B, h, m = c_q.shape
    nb, span = math.ceil(m / w), 1
    for b in range(B):
        for head in range(h):
            queries = sorted(c_q[b, head].tolist())
            keys = c_k[b, head].tolist()
            counts = [keys.count(c) for c in range(num_clusters)]
            starts = [sum(counts[:c]) for c in range(num_clusters)]
            for j in range(nb):
                first, last = queries[j * w], queries[min((j + 1) * w, m) - 1]
                lo, hi = starts[first], starts[last] + counts[last]
                span = max(span, math.ceil((hi - lo) / w))
    return span


@pytest.mark.parametrize("grid,prefix,options", CASES)
def test_fast_routing_heads_equal_the_reference_given_the_naive_decision(grid, prefix, options):
    attn = make_attention("routing", grid, prefix, **options).double().eval()
    q, k, v = routing_inputs(attn, grid, prefix)
    c_q, c_k = compare(attn, grid, q, k, v)
    assert attn.spans[grid] == expected_span(c_q, c_k, attn.cluster_size(grid), attn.num_clusters)


@pytest.mark.parametrize("prefix", [0, 1])
def test_unbalanced_clusters_and_a_cluster_without_keys(prefix):
    """Most queries and keys go to centroid 0, a few keys to centroid 1, a few queries to centroid 2 (which holds
    no key: they attend to their own key); the span then covers nearly every key block."""
    grid = (6, 10)
    attn = make_attention("routing", grid, prefix).double().eval()  # heads 2, 3 route; K = 8, w = 8, nb = 8
    mu = attn.centroids  # [h_r, K, d]
    (qg, qp), (kg, kp), (vg, vp) = routing_inputs(attn, grid, prefix)
    with torch.no_grad():
        qg.copy_(mu[None, :, 0:1] * 4 + 0.3 * qg)
        kg.copy_(mu[None, :, 0:1] * 4 + 0.3 * kg)
        kg[:, :, 50:53] = mu[None, :, 1:2] * 4
        qg[:, :, 20:23] = mu[None, :, 2:3] * 4
    c_q, c_k = compare(attn, grid, (qg, qp), (kg, kp), (vg, vp))
    assert (c_k == 0).float().mean() > 0.9 and (c_q == 0).float().mean() > 0.9  # very unbalanced
    assert (c_q == 2).any() and not (c_k == 2).any()  # a query cluster without a key
    span = attn.spans[grid]
    assert span == expected_span(c_q, c_k, 8, 8) and span >= 7


def test_span_is_the_decision_s_and_flops_use_it():
    grid, prefix = (8, 8), 1
    torch.manual_seed(1)
    attn = make_attention("routing", grid, prefix).eval()
    assert attn.symbols(grid)["S"] == 2  # before any forward: balanced clusters
    assert make_attention("routing", (3, 4), 0, num_clusters=1).symbols((3, 4))["S"] == 1  # at most nb
    before = attn.flops(grid)
    x = torch.randn(1, 65, 32)
    with torch.no_grad():
        q, k, _ = attn.split_heads(x)
        c_q, c_k = attn.nearest(q[:, 2:, 1:], k[:, 2:, 1:])
        attn(x, grid)
    span = attn.spans[grid]
    assert span == expected_span(c_q, c_k, 8, 8) and attn.symbols(grid)["S"] == span
    symbols = attn.symbols(grid)
    assert round(evaluate_formula(attn.formula, symbols)) == attn.flops(grid)
    h_r, d = 2, 8  # 2 routing heads of 8 channels: nb = 8 blocks of w = 8 queries against S·w keys
    assert attn.flops(grid) - before == h_r * 2 * 8 * 8 * (span - 2) * 8 * d
    with torch.no_grad():  # fvcore's trace reads S from the data as eager mode does
        measured = flop_analysis(Host(attn, grid), (x,)).by_module()["attn"]
    assert attn.spans[grid] == span and measured == attn.flops(grid)
    assert not any("span" in key for key in attn.state_dict())  # kept on the module, not saved


def test_fixed_size_path_equals_eager(monkeypatch):
    """Under compile, export and traces every block scores every key block (S = nb): the same outputs and
    gradients as the data's span."""
    grid, prefix = (5, 7), 1
    attn = make_attention("routing", grid, prefix).double().eval()
    torch.manual_seed(2)
    x = torch.randn(2, 36, 32, dtype=torch.float64, requires_grad=True)
    eager = attn(x, grid)
    (g_eager,) = torch.autograd.grad(eager.square().sum(), x)
    span = attn.spans[grid]
    monkeypatch.setattr(routing_module, "fixed_sizes", lambda: True)
    fixed = attn(x, grid)
    (g_fixed,) = torch.autograd.grad(fixed.square().sum(), x)
    nb = math.ceil(35 / attn.cluster_size(grid))
    assert attn.spans[grid] == nb > span
    torch.testing.assert_close(fixed, eager, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_fixed, g_eager, rtol=1e-10, atol=1e-12)


def test_a_jit_trace_fixes_the_span_to_every_block():
    grid = (8, 8)
    attn = make_attention("routing", grid, 1).eval()
    x = torch.randn(2, 65, 32)
    with torch.no_grad():
        expected = attn(x, grid)
        traced = torch.jit.trace(Host(attn, grid), x, check_trace=False)
        assert attn.spans[grid] == 8  # nb
        torch.testing.assert_close(traced(x), expected)
        torch.testing.assert_close(traced(x[:1].flip(1)), attn(x[:1].flip(1), grid))  # other data, other batch


def test_a_compiled_graph_reports_the_dense_span_it_computes(monkeypatch):
    """A compiled graph scores every key block (S = nb): after running it, ``flops()`` is that graph's cost (equal
    to fvcore's count of the fixed-size path); an eager forward reports the data's S again."""
    grid = (5, 7)
    attn = make_attention("routing", grid, 1).eval()
    nb = math.ceil(35 / attn.cluster_size(grid))
    torch.manual_seed(2)
    x = torch.randn(2, 36, 32)
    compiled = torch.compile(Host(attn, grid), backend="eager", fullgraph=True, dynamic=False)
    with torch.no_grad():
        eager = attn(x, grid)
        span, eager_flops = attn.spans[grid], attn.flops(grid)
        assert span < nb
        torch.testing.assert_close(compiled(x), eager)
        assert attn.spans[grid] == nb and attn.symbols(grid)["S"] == nb and attn.flops(grid) > eager_flops
        dense_flops = attn.flops(grid)
        attn(x, grid)
        assert attn.flops(grid) == eager_flops
        compiled(x)  # the same graph again, no new trace: its write is replayed
        assert attn.flops(grid) == dense_flops
        monkeypatch.setattr(routing_module, "fixed_sizes", lambda: True)  # fvcore counts the fixed-size path
        assert flop_analysis(Host(attn, grid), (x[:1],)).by_module()["attn"] == dense_flops
