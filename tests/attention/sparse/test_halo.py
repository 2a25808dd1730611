"""Blocked (halo) neighbourhood attention and global tokens that read the sequence.

The float64 agreement of every sparse backend with its dense masked reference is in
tests/attention/test_registry.py and tests/attention/sparse/test_sparse_patterns.py;
here: the per-axis plans against the
range-test masks of :func:`axis_mask`, block and halo sizes, which outputs depend on which inputs.
"""

from __future__ import annotations

import pytest
import torch
from conftest import backends, make_attention

from vitzoo.attention import ConfigError
from vitzoo.attention.sparse.geometry import axis_mask
from vitzoo.attention.sparse.halo import HaloGroup, axis_plan
from vitzoo.attention.sparse.pattern import SparsePatternAttention
from vitzoo.ops import halo as halo_ops
from vitzoo.ops import select
from vitzoo.ops.halo import halo_scores

SPARSE = backends("sparse", SparsePatternAttention)
AXES = [
    (n, k, dil, border)
    for n in range(1, 14)
    for k in (1, 3, 5)
    for dil in (1, 2, 3)
    for border in ("shift", "mask")
    if k * dil <= n or border == "mask"
]


def test_axis_plan_hand_checked():
    queries, halo, mask, inverse = axis_plan(9, 3, 1, "shift")
    assert queries.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 8, 8, 8]]  # last block padded with its own query
    assert halo.tolist() == [[0, 1, 2, 3, 4, 5], [3, 4, 5, 6, 7, 8], [3, 4, 5, 6, 7, 8]]  # b + 2r, moved inward
    assert mask[0, 0].tolist() == [True, True, True, False, False, False]  # query 0: keys 0..2 (shifted)
    assert mask[2, 0].tolist() == [False, False, False, False, False, True, True, True][2:]  # query 8: keys 6..8
    assert inverse.tolist() == list(range(9))
    queries, halo, _, inverse = axis_plan(7, 3, 2, "shift")  # sub-lattices {0, 2, 4, 6} and {1, 3, 5}
    assert queries.tolist() == [[0, 2, 4, 6], [1, 3, 5, 1]] and halo.tolist() == [[0, 2, 4, 6], [1, 3, 5, -1]]
    assert inverse.tolist() == [0, 4, 1, 5, 2, 6, 3]


@pytest.mark.parametrize("n,kernel,dilation,border", AXES)
def test_axis_plan_masks_exactly_the_neighbourhood(n, kernel, dilation, border):
    """Each query slot's halo mask is its row of the range-test mask; every position has one output slot."""
    queries, halo, mask, inverse = axis_plan(n, kernel, dilation, border)
    dense = axis_mask(n, kernel, dilation, border)  # [n, n]
    b = queries.shape[1]
    rows = dense[queries]  # [m, b, n]
    expected = rows.gather(2, halo.clamp(min=0)[:, None, :].expand(-1, b, -1)) & (halo >= 0)[:, None, :]  # [m, b, hb]
    assert torch.equal(mask, expected)
    assert torch.equal(mask.sum(-1), dense[queries].sum(-1)), "a key is missing from a halo"
    assert torch.equal(queries.flatten()[inverse], torch.arange(n))
    assert halo.shape[1] <= b + 2 * (kernel // 2)


def test_halo_sizes_and_dilated_sub_lattices():
    """At 64x64 every block is 4x4 queries over a 6x6 halo: 36 keys per query, dilated or not."""
    for dilation in (1, 2):
        group = HaloGroup(1, (64, 64), 3, (dilation, dilation), "shift")
        assert group.query_slots() == 64 * 64 and group.halo_keys() == 36
        assert group.mask.float().mean() > 0.2  # 9 of 36 keys for interior queries: the halo is not mostly masked
    small = HaloGroup(1, (4, 4), 3, (1, 1), "shift")  # Swin's last stage: one block, the whole grid
    assert small.mask.shape == (1, 16, 16)


@pytest.mark.parametrize("name", ["global_tokens", "longformer"])
@pytest.mark.parametrize("prefix", [0, 1])
def test_far_token_reaches_every_query_through_the_global_tokens(name, prefix):
    """Perturbing the token at the far corner changes token (0, 0)'s output in one layer (Swin and ViT hosts):
    learned tokens that read the sequence in the layer (longformer's per-layer form)."""
    torch.manual_seed(0)
    opts = {"global_tokens": "per_layer"} if name == "longformer" else {}
    attn = make_attention(name, (8, 8), prefix, **opts).double().eval()
    x = torch.randn(1, prefix + 64, 32, dtype=torch.float64)
    y = x.clone()
    y[0, -1] += 1.0  # token (7, 7)
    with torch.no_grad():
        change = (attn(x, (8, 8))[0, prefix] - attn(y, (8, 8))[0, prefix]).abs().max()
        ref_change = (attn.reference(x, (8, 8))[0, prefix] - attn.reference(y, (8, 8))[0, prefix]).abs().max()
    assert change > 1e-6 and ref_change > 1e-6
    local = make_attention("local", (8, 8), 0).double().eval()  # no global token: the corner is out of reach
    with torch.no_grad():
        assert torch.equal(local(x[:, prefix:], (8, 8))[0, 0], local(y[:, prefix:], (8, 8))[0, 0])


@pytest.mark.parametrize("name", SPARSE)
@pytest.mark.parametrize("prefix", [0, 1])
def test_every_query_depends_on_its_whole_pattern(name, prefix):
    """The gradient of each grid query's output reaches every grid key its pattern (any head) allows."""
    torch.manual_seed(0)
    grid = (6, 6)
    attn = make_attention(name, grid, prefix).double().eval()
    allowed = attn.grid_mask(grid).any(dim=0)  # [L, L]
    x = torch.randn(1, prefix + 36, 32, dtype=torch.float64, requires_grad=True)
    out = attn(x, grid)
    for i in range(36):
        (grad,) = torch.autograd.grad(out[0, prefix + i].sum(), x, retain_graph=True)
        reached = grad[0, prefix:].abs().sum(-1) > 0  # [L]
        assert bool(reached[allowed[i]].all()), f"{name}: query {i} misses keys {(allowed[i] & ~reached).nonzero()}"


@pytest.mark.parametrize("name", ["local", "dilated"])
@pytest.mark.parametrize("grid,prefix,kernel", [((8, 8), 1, 3), ((5, 7), 0, 5), ((4, 4), 0, 3), ((12, 9), 1, 3)])
def test_relative_position_bias_matches_reference(name, grid, prefix, kernel):
    """NAT's and DiNAT's (2k-1)² bias per head (on by default): fast path = dense reference; no extra counted
    FLOPs; the table learns."""
    torch.manual_seed(0)
    attn = make_attention(name, grid, prefix, kernel_size=kernel).double().eval()
    plain = make_attention(name, grid, prefix, kernel_size=kernel, rel_pos_bias=False)
    assert attn.rel_pos_bias.shape == (4, 2 * kernel - 1, 2 * kernel - 1) and attn.flops(grid) == plain.flops(grid)
    with torch.no_grad():
        attn.rel_pos_bias.normal_()  # a table far from zero
    x = torch.randn(2, prefix + grid[0] * grid[1], 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, grid), attn.reference(x, grid), rtol=1e-6, atol=1e-8)
    attn(x, grid).sum().backward()
    assert attn.rel_pos_bias.grad is not None and attn.rel_pos_bias.grad.abs().sum() > 0


@pytest.mark.parametrize("num_global", [0, 2])
@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.parametrize("one_block_per_chunk", [False, True])
def test_biased_halo_function_gradcheck(num_global, dilation, one_block_per_chunk, monkeypatch):
    """The biased halo path's autograd Function (blocks and probabilities recomputed from the log-sum-exp in
    backward, all blocks at once at this size or one query block per chunk) against numerical gradients for q, k,
    v, the global keys/values and the bias table; its output is the plain path's."""
    torch.manual_seed(0)
    grid, c, d, k = (6, 7), 2, 4, 3
    group = HaloGroup(c, grid, k, (dilation, dilation), "shift", offsets=True).double()
    if one_block_per_chunk:
        assert group.mask.shape[0] > 1
        monkeypatch.setattr(halo_ops, "chunk_blocks", lambda *a: 1)
    L = grid[0] * grid[1]
    q, kk, v = (torch.randn(2, c, L, d, dtype=torch.float64, requires_grad=True) for _ in range(3))
    k_glob, v_glob = (torch.randn(2, c, num_global, d, dtype=torch.float64, requires_grad=True) for _ in range(2))
    table = torch.randn(c, (2 * k - 1) ** 2, dtype=torch.float64, requires_grad=True)

    def fn(q, kk, v, k_glob, v_glob, table):
        return halo_scores(q, kk, v, group, k_glob, v_glob, 0.5, None, (table, group.rel))

    assert select("halo_scores", q, kk, v, 0.0) == "autograd_function"
    assert torch.autograd.gradcheck(fn, (q, kk, v, k_glob, v_glob, table))
    with torch.no_grad():  # inference records the plain ops
        plain = fn(q, kk, v, k_glob, v_glob, table)
    torch.testing.assert_close(fn(q, kk, v, k_glob, v_glob, table), plain, rtol=1e-12, atol=1e-12)


def test_dilated_bias_is_indexed_in_steps_of_the_dilation():
    """DiNAT: a key δ·(a, b) away from its query reads table[k-1+a, k-1+b] (coordinates, not the backend's tables)."""
    torch.manual_seed(0)
    grid, k, delta = (12, 12), 3, 2
    attn = make_attention("dilated", grid, 0, kernel_size=k, dilation=delta).double().eval()
    table = torch.zeros(4, 2 * k - 1, 2 * k - 1, dtype=torch.float64)
    table[:, k - 1 + 1, k - 1 - 1] = 50.0  # key one δ-step down and one left of the query: dominant
    with torch.no_grad():
        attn.rel_pos_bias.copy_(table)
    x = torch.randn(1, 144, 32, dtype=torch.float64)
    q = (5, 6)  # interior query: its neighbourhood is centred
    key = (q[0] + delta, q[1] - delta)
    out = attn(x, grid)[0, q[0] * 12 + q[1]]
    # with one key at weight ~1 the output is that key's value projected: compare with a one-hot attention
    v = attn.qkv(x)[0, key[0] * 12 + key[1], 64:]  # [C] value row of that key
    torch.testing.assert_close(out, attn.proj(v), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["local", "dilated"])
def test_relative_position_bias_is_a_bool_option(name):
    with pytest.raises(ConfigError, match=r"attention.rel_pos_bias must be true or false"):
        make_attention(name, (8, 8), 0, rel_pos_bias=1)
    assert make_attention(name, (8, 8), 0).rel_pos_bias is not None  # the paper's default
    off = make_attention(name, (8, 8), 0, rel_pos_bias=False)
    assert off.rel_pos_bias is None and "rel_pos_bias" not in dict(off.named_parameters())
