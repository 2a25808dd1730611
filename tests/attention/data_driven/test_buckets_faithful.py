"""The data-driven backends follow their papers: routing's local heads and nearest-centroid clusters, reformer's
bucket count that grows with the sequence (sinkhorn: test_sinkhorn.py)."""
from __future__ import annotations

import pytest
import torch
from conftest import Host, make_attention

from vitzoo.attention import ConfigError
from vitzoo.flops import flop_analysis


def window_members(attn, m: int) -> torch.Tensor:
    """``[M, M]`` True where grid tokens i and j share one of the local heads' windows."""
    w = attn.cluster_size((m, 1))
    idx = attn.windows(m, w, torch.device("cpu"))  # [K, w]
    inside = torch.zeros(m, idx.shape[0], dtype=torch.bool)
    inside[idx, torch.arange(idx.shape[0]).unsqueeze(-1)] = True  # [M, K]
    return (inside.float() @ inside.float().T) > 0


@pytest.mark.parametrize("grid", [(8, 8), (6, 10), (7, 7)])
def test_routing_windows_cover_every_token_once_or_twice(grid):
    attn = make_attention("routing", grid, 0)
    m = grid[0] * grid[1]
    idx = attn.windows(m, attn.cluster_size(grid), torch.device("cpu"))
    counts = torch.bincount(idx.flatten(), minlength=m)
    assert counts.min() >= 1 and counts.max() <= 2 and idx.max() == m - 1
    assert (idx[:, 1:] - idx[:, :-1] == 1).all()  # consecutive tokens


@pytest.mark.parametrize("prefix", [0, 1], ids=["swin", "vit"])
def test_routing_every_token_attends_to_its_window(prefix):
    """Every grid token's output is non-zero, and in a local head it depends on exactly its window's values."""
    torch.manual_seed(0)
    grid, m = (6, 10), 60
    attn = make_attention("routing", grid, prefix).double().eval()  # 4 heads: 0, 1 local; 2, 3 routing
    x = torch.randn(1, prefix + m, 32, dtype=torch.float64)
    q, k, v = (t.detach() for t in attn.split_heads(x))
    v.requires_grad_()
    out = attn.attend(q, k, v, grid)[:, :, prefix:]  # [1, h, M, d]
    assert (out.abs().amax(-1).amax(1) > 0).all()  # every token, over its heads
    assert (out[:, :2].abs().amax(-1) > 0).all()  # every token in every local head
    share = window_members(attn, m)
    for token in range(m):
        grad, = torch.autograd.grad(out[0, 0, token].sum(), v, retain_graph=True)
        depends = grad[0, 0, prefix:].abs().amax(-1) > 0  # [M] grid values that reach this token
        assert torch.equal(depends, share[token]), token
        assert depends[token]


def test_routing_local_heads_option():
    assert make_attention("routing", (8, 8), 0).local_heads == 2
    assert make_attention("routing", (8, 8), 0, heads=2, dim=16).local_heads == 1
    attn = make_attention("routing", (8, 8), 0, local_heads=3)
    assert attn.local_heads == 3 and attn.centroids.shape == (1, 8, 8)
    with pytest.raises(ConfigError, match="attention.local_heads=5 is more than the 4 heads") as err:
        make_attention("routing", (8, 8), 0, local_heads=5)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="attention.local_heads must be a positive integer"):
        make_attention("routing", (8, 8), 0, local_heads=0)


def test_routing_only_local_heads_matches_reference():
    torch.manual_seed(0)
    attn = make_attention("routing", (6, 10), 1, local_heads=4).double().eval()
    x = torch.randn(2, 61, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, (6, 10)), attn.reference(x, (6, 10)), rtol=1e-6, atol=1e-8)
    attn.train()(x, (6, 10)).sum().backward()  # no routing head: no centroid step


def test_reformer_buckets_grow_with_the_sequence():
    sizes = {
        side: make_attention("reformer", (side, side), 0, bucket_size=16).n_buckets((side, side))
        for side in (4, 8, 16, 32)
    }
    assert sizes == {4: 2, 8: 4, 16: 16, 32: 64}  # ⌈M/16⌉, even, >= 2
    assert make_attention("reformer", (6, 10), 0, bucket_size=12).n_buckets((6, 10)) == 6  # 60/12 = 5 -> 6
    attn = make_attention("reformer", (16, 16), 1, bucket_size=16).eval()
    assert attn.rotations.shape == (4, 8, 2, 8)  # [h, d, n_hashes, n_b/2]
    q, k, _ = attn.split_heads(torch.randn(1, 257, 32))
    buckets = attn.hash(k[:, :, 1:], 16)
    assert buckets.max() < 16 and len(buckets.unique()) > 8  # the 256 tokens spread over the 16 buckets
    assert attn.symbols()["n_b"] == 16


def test_reformer_smaller_grid_uses_fewer_buckets_larger_grid_is_a_config_error():
    torch.manual_seed(0)
    attn = make_attention("reformer", (8, 8), 1, chunk_size=8, bucket_size=8).double().eval()  # 8 buckets
    x = torch.randn(2, 17, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, (4, 4)), attn.reference(x, (4, 4)), rtol=1e-6, atol=1e-8)  # 2 buckets
    with pytest.raises(
        ConfigError, match="attention=reformer needs 32 buckets at the 16x16 grid but was built for the 8x8 grid"
    ) as err:
        attn(torch.randn(1, 257, 32, dtype=torch.float64), (16, 16))
    assert "\n" not in str(err.value)


def test_reformer_old_fixed_bucket_option_is_gone():
    with pytest.raises(ConfigError, match="unknown option attention.n_buckets"):
        make_attention("reformer", (8, 8), 1, n_buckets=8)


@pytest.mark.parametrize("grid,prefix", [((8, 8), 1), ((14, 14), 0), ((6, 10), 1)])
def test_routing_nearest_centroid_equals_the_naive_decision(grid, prefix):
    """The fast assignment (one matmul, argmax) equals the per-row Euclidean argmin of the reference."""
    from vitzoo.attention.data_driven.routing import naive_nearest
    torch.manual_seed(0)
    attn = make_attention("routing", grid, prefix).double().eval()
    q, k, _ = attn.split_heads(torch.randn(2, prefix + grid[0] * grid[1], 32, dtype=torch.float64))
    hl = attn.local_heads
    c_q, c_k = attn.nearest(q[:, hl:, prefix:], k[:, hl:, prefix:])
    assert torch.equal(c_q, naive_nearest(q[:, hl:, prefix:], attn.centroids))
    assert torch.equal(c_k, naive_nearest(k[:, hl:, prefix:], attn.centroids))


@pytest.mark.parametrize("prefix", [0, 1], ids=["swin", "vit"])
def test_routing_heads_see_exactly_their_cluster(prefix):
    """Paper (Eq. 7): in a routing head every query is routed (no zero row) and its output depends on exactly
    the values of the keys in its nearest centroid's cluster (given by the naive decision) and the prefix."""
    from vitzoo.attention.data_driven.routing import naive_nearest
    torch.manual_seed(0)
    grid, m = (6, 10), 60
    attn = make_attention("routing", grid, prefix).double().eval()  # heads 0, 1 local; 2, 3 routing
    x = torch.randn(1, prefix + m, 32, dtype=torch.float64)
    q, k, v = (t.detach() for t in attn.split_heads(x))
    v.requires_grad_()
    out = attn.attend(q, k, v, grid)[:, :, prefix:]  # [1, h, M, d]
    assert (out[:, 2:].abs().amax(-1) > 0).all(), "a routing-head output is zero"
    c_q = naive_nearest(q[:, 2:, prefix:], attn.centroids)[0]  # [h_r, M]
    c_k = naive_nearest(k[:, 2:, prefix:], attn.centroids)[0]
    for head in (2, 3):
        for token in range(0, m, 7):
            grad, = torch.autograd.grad(out[0, head, token].sum(), v, retain_graph=True)
            depends = grad[0, head, prefix:].abs().amax(-1) > 0  # [M]
            expected = c_k[head - 2] == c_q[head - 2, token]
            if not expected.any():
                expected[token] = True  # an empty cluster: the query's own key
            assert torch.equal(depends, expected), (head, token)
            if prefix:
                assert grad[0, head, 0].abs().amax() > 0


def test_routing_assignment_option():
    assert make_attention("routing", (8, 8), 0).cfg.assignment == "nearest"  # the paper's
    with pytest.raises(ConfigError, match="attention.assignment must be one of nearest, balanced"):
        make_attention("routing", (8, 8), 0, assignment="topk")
    torch.manual_seed(0)
    attn = make_attention("routing", (6, 10), 1, assignment="balanced").double().eval()
    x = torch.randn(2, 61, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, (6, 10)), attn.reference(x, (6, 10)), rtol=1e-6, atol=1e-8)
        measured = flop_analysis(Host(attn.float(), (6, 10)), (x[:1].float(),)).by_module()["attn"]
    assert measured == attn.flops((6, 10))


def naive_lsh_bucket(x: torch.Tensor, rotation: torch.Tensor) -> int:
    """The paper's angular LSH for one vector: ``h(x) = argmax([xR; -xR])`` with R a ``[d, n_b/2]`` rotation."""
    proj = [float(x @ rotation[:, j]) for j in range(rotation.shape[1])]
    values = proj + [-p for p in proj]
    return max(range(len(values)), key=lambda i: values[i])


@pytest.mark.parametrize("grid", [(8, 8), (6, 10)])
def test_reformer_hash_equals_the_naive_lsh_bucket(grid):
    torch.manual_seed(0)
    attn = make_attention("reformer", grid, 1).double().eval()
    n_b = attn.n_buckets(grid)
    x = torch.randn(2, 4, grid[0] * grid[1], 8, dtype=torch.float64)
    with torch.no_grad():
        buckets = attn.hash(x, n_b)  # [B, h, n_hashes, M]
    rot = attn.rotations[..., : n_b // 2]  # [h, d, n_hashes, n_b/2]
    for b in range(2):
        for h in range(4):
            for r in range(attn.cfg.n_hashes):
                for t in range(0, grid[0] * grid[1], 5):
                    assert int(buckets[b, h, r, t]) == naive_lsh_bucket(x[b, h, t], rot[h, :, r]), (b, h, r, t)
