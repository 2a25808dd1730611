"""Fixed sparse patterns (local, dilated, global_tokens, longformer, bigbird, multi_pattern).

The generic registry tests (tests/attention/test_registry.py) cover shapes, gradients, agreement with the
dense masked reference, FLOPs and determinism; here: bad options, hand-checked index lists, grids
other than the defaults (padding, a grid other than the construction grid), random-block storage,
that no N×N tensor is built, linear FLOPs growth and the two CIFAR models.
"""
from __future__ import annotations

import pytest
import torch
from conftest import Host, RecordShapes, attention_yaml, backends, make_attention, token_by_token, use_cpu_kernel

from vitzoo import create_model
from vitzoo.attention import ConfigError, MixerContext, build_attention
from vitzoo.attention.sparse.geometry import axis_index, fit_dilation, neighbourhood_index
from vitzoo.attention.sparse.pattern import SparsePatternAttention
from vitzoo.flops import evaluate_formula, flop_analysis
from vitzoo.ops import gather

SPARSE = backends("sparse", SparsePatternAttention)  # from the registry: local, dilated, global_tokens, ...
NO_GLOBAL_HEADS = {"patterns": [["local", None], ["dilated", 1]]}


@pytest.mark.parametrize("name,options,message", [
    ("local", {"kernel_size": 5}, r"attention.kernel_size=5 is larger than the 4x4 token grid"),
    ("local", {"kernel_size": 4}, r"attention.kernel_size must be a positive odd integer"),
    ("dilated", {"kernel_size": 7}, r"attention.kernel_size=7 is larger than the 4x4 token grid"),
    ("dilated", {"dilation": 0}, r"attention.dilation must be a positive integer"),
    ("global_tokens", {"num_global": -1}, r"attention.num_global must be a non-negative integer"),
    ("global_tokens", {"num_global": 0}, r"attention.num_global=0 and the model has no class token"),
    ("global_tokens", {"num_global": 17}, r"attention.num_global=17 exceeds the 16 tokens"),
    ("global_tokens", {"kernel_size": 5}, r"attention.kernel_size=5 is larger"),
    ("longformer", {"dilated_heads": 5}, r"attention.dilated_heads=5 exceeds the layer's 4 heads"),
    ("longformer", {"num_global": 20, "global_tokens": "per_layer"}, r"attention.num_global=20 exceeds"),
    ("bigbird", {"block_size": 5}, r"attention.block_size=5 is larger than the 4x4 token grid"),
    ("bigbird", {"num_global_blocks": 4}, r"attention.num_global_blocks=4 leaves no sparse block"),
    ("bigbird", {"num_random": 3}, r"attention.num_random=3 exceeds the 2 non-global other blocks"),
    ("bigbird", {"window_blocks": 2}, r"attention.window_blocks must be a positive odd integer"),
    ("bigbird", {"tile_blocks": 0}, r"attention.tile_blocks must be a positive integer"),
    ("multi_pattern", {"patterns": [["local", 2], ["global", 1]]},
     r"attention.patterns assigns 3 heads but the layer has 4"),
    ("multi_pattern", {"patterns": [["strided", None]]}, r"attention.patterns\[0\] must be \[pattern, heads\]"),
    ("multi_pattern", {"patterns": [["local", None], ["global", None]]}, r"attention.patterns may leave heads null"),
    ("multi_pattern", {"kernel_size": 5}, r"attention.kernel_size=5 is larger"),
])
def test_bad_options_are_one_line_config_errors(name, options, message):
    with pytest.raises(ConfigError, match=message) as err:
        make_attention(name, (4, 4), 0, **options)
    assert "\n" not in str(err.value)


def test_axis_index_hand_checked():
    idx, ok = axis_index(5, 3)  # NA: shifted at the border
    assert idx.tolist() == [[0, 1, 2], [0, 1, 2], [1, 2, 3], [2, 3, 4], [2, 3, 4]] and bool(ok.all())
    idx, _ = axis_index(7, 3, dilation=2)  # DiNAT: sub-lattices {0, 2, 4, 6} and {1, 3, 5}
    assert idx.tolist() == [[0, 2, 4], [1, 3, 5], [0, 2, 4], [1, 3, 5], [2, 4, 6], [1, 3, 5], [2, 4, 6]]
    idx, ok = axis_index(5, 3, border="mask")  # Longformer: centred, out-of-range keys invalid
    assert ok[0].tolist() == [False, True, True] and ok[4].tolist() == [True, True, False]
    assert idx[2].tolist() == [1, 2, 3]


def test_neighbourhood_index_corner_and_centre():
    keys, valid = neighbourhood_index((5, 5), (3, 3))
    assert valid is None and keys.shape == (25, 9)
    assert sorted(keys[0].tolist()) == [0, 1, 2, 5, 6, 7, 10, 11, 12]  # (0, 0): shifted to rows/cols 0..2
    assert sorted(keys[12].tolist()) == [6, 7, 8, 11, 12, 13, 16, 17, 18]  # (2, 2): centred


def test_dilation_shrinks_to_fit_the_grid():
    assert fit_dilation(2, 3, (4, 4)) == (1, 1)
    assert fit_dilation(2, 3, (6, 10)) == (2, 2)
    assert fit_dilation(4, 3, (5, 9)) == (1, 3)


def test_local_with_kernel_covering_the_grid_is_global_attention():
    torch.manual_seed(0)
    local = make_attention("local", (5, 5), 1, kernel_size=5, rel_pos_bias=False).double().eval()
    dense = make_attention("global", (5, 5), 1).double().eval()
    dense.load_state_dict(local.state_dict())
    x = torch.randn(2, 26, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(local(x, (5, 5)), dense(x, (5, 5)), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name,options", [
    ("bigbird", {}), ("bigbird", {"block_size": 3, "num_global_blocks": 2}), ("local", {"kernel_size": 5}),
    ("longformer", {"kernel_size": 5, "dilated_heads": 2}), ("global_tokens", {"num_global": 3}),
    ("multi_pattern", {"dilation": 3}),
])
@pytest.mark.parametrize("grid,prefix", [((5, 7), 1), ((7, 9), 0)])
def test_odd_grids_match_reference_and_flops(name, options, grid, prefix):
    """Grids the blocks do not divide (padding) and larger kernels/dilations than the defaults."""
    torch.manual_seed(0)
    attn = make_attention(name, grid, prefix, **options).double().eval()
    x = torch.randn(2, prefix + grid[0] * grid[1], 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, grid), attn.reference(x, grid), rtol=1e-6, atol=1e-8)
        measured = flop_analysis(Host(attn.float(), grid), (x[:1].float(),)).by_module()["attn"]
    assert measured == attn.flops(grid)


@pytest.mark.parametrize("tile", [1, 3, 9])
@pytest.mark.parametrize("grid,prefix", [((9, 11), 1), ((16, 16), 0)])
def test_bigbird_tiles_keep_the_pattern(tile, grid, prefix):
    """Other query tiles (one block, short border runs, larger than the block grid): the same outputs
    as the default tiles and the reference, FLOPs as fvcore counts them and as the formula gives them."""
    torch.manual_seed(0)
    attn = make_attention("bigbird", grid, prefix, tile_blocks=tile).double().eval()
    default = make_attention("bigbird", grid, prefix).double().eval()
    default.load_state_dict(attn.state_dict())
    x = torch.randn(2, prefix + grid[0] * grid[1], 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, grid), attn.reference(x, grid), rtol=1e-6, atol=1e-8)
        torch.testing.assert_close(attn(x, grid), default(x, grid), rtol=1e-9, atol=1e-10)
        measured = flop_analysis(Host(attn.float(), grid), (x[:1].float(),)).by_module()["attn"]
    assert measured == attn.flops(grid) == evaluate_formula(attn.formula, attn.symbols(grid))


def test_bigbird_tile_keys_and_masks():
    """A 2x2 tile of 1x1 blocks on a 6x6 grid: each query sees exactly its own 3x3 window and random blocks."""
    attn = make_attention("bigbird", (6, 6), 0, block_size=1, num_global_blocks=0, num_random=2)
    group = attn.pattern.groups[0]
    assert group.keys.shape == (4, 9, 16 + 4 * 2) and group.mask.shape == (9, 4, 16 + 4 * 2)
    window, _ = neighbourhood_index((6, 6), (3, 3))
    for head in range(4):
        for tile in range(9):
            for slot, query in enumerate(attn.pattern.query_rows[tile].tolist()):
                seen = group.keys[head, tile][group.mask[tile, slot]].tolist()
                assert sorted(seen) == sorted(window[query].tolist() + attn.random_blocks[head, query].tolist())


@pytest.mark.parametrize("name", SPARSE)
def test_other_grid_than_construction(name):
    """A layer built at 8x8 runs at 6x10 (its pattern is rebuilt for that grid)."""
    torch.manual_seed(0)
    attn = make_attention(name, (8, 8), 1).double().eval()
    x = torch.randn(2, 61, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, (6, 10)), attn.reference(x, (6, 10)), rtol=1e-6, atol=1e-8)


def test_bigbird_random_blocks_are_seeded_stored_and_reloaded():
    a, b = make_attention("bigbird", (16, 16), 0), make_attention("bigbird", (16, 16), 0)  # both layer_index 0
    assert torch.equal(a.random_blocks, b.random_blocks) and "random_blocks" in a.state_dict()
    c = build_attention({"name": "bigbird"}, MixerContext(32, 4, (16, 16), 0, layer_index=3))
    assert not torch.equal(a.random_blocks, c.random_blocks)
    # 8x8 blocks of 2x2, block 0 global: 63 query blocks, each 2 random blocks outside its 3x3 window,
    # drawn per head (one head group, key lists per head); 4x4 tiles of 2x2 blocks, each over the
    # global block's 4 tokens, its 4x4-block halo and its blocks' 4·2 random blocks
    assert a.random_blocks.shape == (4, 64, 2) and len(a.pattern.groups) == 1
    assert a.pattern.groups[0].keys.shape == (4, 16, 4 + (16 + 4 * 2) * 4)
    assert not torch.equal(a.random_blocks[0], a.random_blocks[1])
    window, _ = neighbourhood_index((8, 8), (3, 3))
    for head in range(4):
        for qb in range(1, 64):
            picked = set(a.random_blocks[head, qb].tolist())
            assert len(picked) == 2 and not picked & (set(window[qb].tolist()) | {0})
    # loading another draw rebuilds the index buffers: fast path still equals the reference
    a.load_state_dict(c.state_dict())
    a.double().eval()
    x = torch.randn(1, 256, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(a(x, (16, 16)), a.reference(x, (16, 16)), rtol=1e-6, atol=1e-8)


def test_multi_pattern_without_global_heads_builds_no_token_by_token_tensor():
    """Other sparse backends are covered by test_attention's generic check; this is the non-default mix."""
    attn = make_attention("multi_pattern", (32, 32), 1, **NO_GLOBAL_HEADS)
    x = torch.randn(1, 1025, 32, requires_grad=True)
    with RecordShapes() as rec:
        attn(x, (32, 32)).sum().backward()
    assert not token_by_token(rec.shapes, 1025), token_by_token(rec.shapes, 1025)[:3]


def test_multi_pattern_linear_cost_depends_on_global_heads():
    assert not make_attention("multi_pattern", (16, 16), 0).grows_linearly
    measured = {}
    for side in (16, 64):
        attn = make_attention("multi_pattern", (side, side), 0, **NO_GLOBAL_HEADS).eval()
        assert attn.grows_linearly
        with torch.no_grad():
            x = torch.zeros(1, side * side, 32)
            measured[side] = flop_analysis(Host(attn, (side, side)), (x,)).by_module()["attn"]
    assert measured[64] <= 16 * measured[16] * 1.05, measured


@pytest.mark.parametrize("model", ["vit_cifar", "swin_cifar"])
@pytest.mark.parametrize("name", SPARSE)
def test_builds_and_trains_in_cifar_models(name, model):
    torch.manual_seed(0)
    net = create_model(model, attention=attention_yaml(name))
    assert name in repr(net)
    out = net(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    out.logsumexp(-1).sum().backward()
    assert all(p.grad is not None for p in net.parameters() if p.requires_grad)


@pytest.mark.parametrize("name", SPARSE)
@pytest.mark.parametrize("grid,prefix,path", [((8, 8), 1, "kernel"), ((7, 9), 0, "kernel"), ((8, 8), 1, "flash"),
                                              ((7, 9), 0, "flash"), ((7, 9), 1, "chunked"), ((8, 8), 1, "checkpoint")])
def test_gradients_match_reference(name, grid, prefix, path, monkeypatch):
    """Backward recomputes the gathered blocks (vitzoo's compiled kernel; without it the CPU flash kernel
    with our backward, or SDPA checkpointed chunk by chunk as on GPU or with dropout; in one call or one block per
    call):
    its gradients for the input and every parameter are those of the dense masked reference."""
    use_cpu_kernel("block_attention", path == "kernel", monkeypatch)
    if path == "chunked":
        monkeypatch.setattr(gather, "GATHER_ELEMS", 1)  # one block per fused call
    if path == "checkpoint":  # each chunk of blocks checkpointed on its own (autocast, dropout, GPU), several chunks
        monkeypatch.setattr(gather, "GATHER_ELEMS", 1)
        monkeypatch.setattr(gather._BlockSDPA, "apply", lambda *a: gather._block_sdpa(*a, 0.0, recompute=True))
    torch.manual_seed(0)
    attn = make_attention(name, grid, prefix).double().train()
    x = torch.randn(2, prefix + grid[0] * grid[1], 32, dtype=torch.float64, requires_grad=True)
    g = torch.randn_like(x)
    params = [p for p in attn.parameters() if p.requires_grad]
    fast = torch.autograd.grad(attn(x, grid), [x, *params], g, allow_unused=True)
    ref = torch.autograd.grad(attn.reference(x, grid), [x, *params], g, allow_unused=True)
    for a, b in zip(fast, ref):
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("kernel", [True, False])
def test_block_attention_gradcheck(per_head, kernel, monkeypatch):
    """The block Function (vitzoo's compiled kernel, or the CPU flash kernel with two blocks per call) in float64:
    global keys joined per chunk, output rows picked by ``out_ids`` (one slot dropped), shared or per-head key
    ids, q/k/v as strided views of one fused projection output."""
    use_cpu_kernel("block_attention", kernel, monkeypatch)
    monkeypatch.setattr(gather, "GATHER_ELEMS", 2 * 2 * 3 * 4)  # 2 blocks of 3 keys for 2 heads of d = 4
    torch.manual_seed(0)
    qkv = torch.randn(2, 7, 3, 2, 4, dtype=torch.float64, requires_grad=True)  # [B, L, 3, c, d]
    glob = torch.randn(2, 2, 1, 4, dtype=torch.float64, requires_grad=True)  # [B, c, G, d]
    q_ids = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 6]])  # [n, S]: the last slot repeats query 6
    k_ids = torch.tensor([[0, 1, 2], [1, 2, 3], [3, 4, 5], [4, 5, 6]])  # [n, K]
    if per_head:
        k_ids = torch.stack([k_ids, k_ids.flip(-1)])  # [c, n, K]
    mask = torch.rand(*k_ids.shape[:-1], 2, 4) > 0.3  # [.., n, S, G + K]
    mask[..., 0] = True  # no all-False row
    out_ids = torch.arange(7)  # slots 0..6 fill the rows; slot 7 is dropped

    def fn(qkv, glob):
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, c, L, d] views
        return gather.block_attention(q, k, v, q_ids, k_ids, mask, 0.5, 0.0, glob, glob * 2, out_ids)

    assert torch.autograd.gradcheck(fn, (qkv, glob))
